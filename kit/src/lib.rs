//! The adapter test kit: dualera's transcript vectors as a black-box suite any era
//! bridge can run.
//!
//! A transcript vector (`adapters/vectors/*.json`, format in that folder's README) is
//! one legacy session's inputs and the exact outputs expected after each. This crate
//! holds three things:
//!
//! - [`format`]: the vector format (version [`format::FORMAT_VERSION`]), parsed and
//!   checked;
//! - [`matching`]: placeholders, implementation-defined fields, diffs; shared by the
//!   in-process runner of the sans-IO session machine (`adapters/tests/vectors.rs`)
//!   and the black-box runner;
//! - [`runner`] (feature `runner`): `dualera vectors run`, which plays **both** ends of
//!   the wire around a bridge under test and scores it, and [`report`] (table, JUnit).
//!
//! What it does **not** do: it never links the bridge it tests (not even dualera's own
//! session machine); it knows the bridge only by its wires.
//!
//! ```text
//!                  ┌──────────── runner (one vector at a time) ────────────┐
//!   vector steps ─►│ legacy host  ──POST/GET/DELETE or stdin──►  bridge    │
//!                  │   (plays peer steps, answers live requests)  under    │
//!                  │ scripted upstream ◄──2026-07-28 HTTP POST──  test     │
//!                  │   (answers as the upstream steps say)                 │
//!                  │ everything observed ──► matcher ──► pass / first diff │
//!                  └───────────────────────────────────────────────────────┘
//! ```

pub mod format;
pub mod matching;
pub mod report;
#[cfg(feature = "runner")]
pub mod runner;
