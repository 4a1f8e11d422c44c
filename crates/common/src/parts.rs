//! Parts of dualera a build may leave out (Cargo features of the `dualera` package:
//! `sqlite`, `postgres`, `redis`, `kit`, `tls`). A configuration or command that
//! needs a part this build lacks is refused when the program starts, with this one
//! error naming the feature to rebuild with, wherever the need is noticed.

/// A configuration or command names a part this binary was built without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this dualera was built without the `{feature}` feature; rebuild with `--features {feature}`"
)]
pub struct NotBuilt {
    /// The Cargo feature of the `dualera` package that turns the part on.
    pub feature: &'static str,
}

impl NotBuilt {
    /// The part behind `feature` is missing.
    pub const fn new(feature: &'static str) -> Self {
        Self { feature }
    }
}

#[cfg(test)]
mod tests {
    use super::NotBuilt;

    #[test]
    fn names_the_feature_to_rebuild_with() {
        assert_eq!(
            NotBuilt::new("redis").to_string(),
            "this dualera was built without the `redis` feature; rebuild with `--features redis`"
        );
    }
}
