//! The migration report's file in a build without the `sqlite` feature: the report
//! is kept in memory only, and a configured `[report] path` is refused when the
//! gateway starts, with the feature to rebuild with.

use super::HostReport;
use dualera_common::parts::NotBuilt;
use std::path::Path;

/// Errors of the report's file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// `[report] path` names a file, and files need the `sqlite` feature.
    #[error("[report] path: {0}")]
    NotBuilt(#[from] NotBuilt),
}

/// No file can be open in this build.
#[derive(Debug)]
pub(super) enum Store {}

impl Store {
    /// Refuses: this build has no SQLite.
    pub(super) fn open(_path: &Path) -> Result<Self, ReportError> {
        Err(NotBuilt::new("sqlite").into())
    }

    pub(super) fn load(&self, _max: usize) -> Result<Vec<HostReport>, ReportError> {
        match *self {}
    }

    pub(super) fn save(&self, _rows: &[HostReport]) -> Result<(), ReportError> {
        match *self {}
    }
}
