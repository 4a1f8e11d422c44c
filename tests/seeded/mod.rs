//! The seeded runner shared by the property and fuzz tests (the adapters' session
//! machine properties include it by path): every run prints its seed, a failure
//! prints the seed and the minimal case, and `DUALERA_PROPTEST_SEED=<64 hex>` replays
//! it (`random` picks a fresh seed); `DUALERA_PROPTEST_CASES=N` overrides the case
//! count of every property.

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

/// A property's verdict on one case: `Err` names the broken invariant.
pub(crate) type Check = Result<(), String>;

fn seed() -> [u8; 32] {
    let hex = std::env::var("DUALERA_PROPTEST_SEED").ok();
    let mut seed = *b"dualera session machine props!!!";
    match hex.as_deref() {
        None | Some("") => {}
        Some("random") => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let h = std::collections::hash_map::RandomState::new();
            use std::hash::{BuildHasher, Hasher};
            for (i, chunk) in seed.chunks_mut(8).enumerate() {
                let mut hasher = h.build_hasher();
                hasher.write_u128(t);
                hasher.write_usize(i);
                chunk.copy_from_slice(&hasher.finish().to_le_bytes());
            }
        }
        Some(h) => {
            assert_eq!(h.len(), 64, "DUALERA_PROPTEST_SEED is 64 hex digits");
            for (i, b) in seed.iter_mut().enumerate() {
                *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex seed");
            }
        }
    }
    seed
}

/// Runs `test` over `cases` generated cases (unless `DUALERA_PROPTEST_CASES` says
/// otherwise) from the run's seed; a failure panics with the seed (to replay) and
/// the minimal failing case.
pub(crate) fn run_seeded<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(&S::Value) -> Check,
) where
    S::Value: std::fmt::Debug,
{
    let cases = std::env::var("DUALERA_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let seed = seed();
    let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    eprintln!("{name}: {cases} cases, seed {hex}");
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 20_000,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    match runner.run(&strategy, |v| test(&v).map_err(TestCaseError::fail)) {
        Ok(()) => {}
        Err(TestError::Fail(reason, minimal)) => panic!(
            "{name} failed: {reason}\nminimal case: {minimal:#?}\nreplay: DUALERA_PROPTEST_SEED={hex} {}",
            std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default()
        ),
        Err(e) => panic!("{name}: {e} (seed {hex})"),
    }
}
