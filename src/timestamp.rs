//! Wall-clock timestamps as text: the migration report (gateway) and task times (modern
//! server) both print them, and neither may borrow from the other; the formatter lives
//! in the adapters crate, which the session machine's gateway-made tasks use too.

pub use dualera_adapters::time::rfc3339;
