//! Explicit scope: `file:` URIs and repository paths normalized to path components,
//! and containment decided component by component, never by string prefix.
//!
//! `file:///work/notes-evil/x` is not inside `file:///work/notes`, and
//! `file:///work/notes/%2e%2e/private.md` normalizes to `/work/private.md`, which is
//! not either. An encoded separator (`%2f`, `%5c`) or NUL is refused outright.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use std::path::{Path, PathBuf};

/// Why a URI or path is not an acceptable scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// Not a `file:` URI (or not an absolute path).
    #[error("{value:?} is not a file: URI with an absolute path")]
    NotFileUri {
        /// The value given.
        value: String,
    },
    /// Has a host other than `localhost`, a query or a fragment.
    #[error("{value:?} must have no host, query or fragment")]
    Unsupported {
        /// The value given.
        value: String,
    },
    /// A percent-encoded separator, NUL, or bytes that are not UTF-8.
    #[error("{value:?} contains an encoded path separator or invalid bytes")]
    BadEncoding {
        /// The value given.
        value: String,
    },
    /// `..` climbs above the root.
    #[error("{value:?} climbs above the filesystem root")]
    AboveRoot {
        /// The value given.
        value: String,
    },
}

/// A normalized absolute path, as components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    components: Vec<String>,
}

const PATH_SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'/')
    .add(b'\\');

impl Scope {
    /// Parses a `file:` URI: `file:///abs/path` or `file://localhost/abs/path`.
    pub fn from_file_uri(uri: &str) -> Result<Self, ScopeError> {
        let value = || uri.to_owned();
        let rest = uri
            .strip_prefix("file://")
            .ok_or_else(|| ScopeError::NotFileUri { value: value() })?;
        if rest.contains('?') || rest.contains('#') {
            return Err(ScopeError::Unsupported { value: value() });
        }
        let path = if let Some(p) = rest.strip_prefix("localhost") {
            p
        } else {
            rest
        };
        if !path.starts_with('/') {
            return Err(ScopeError::Unsupported { value: value() });
        }
        let mut decoded = Vec::new();
        for raw in path.split('/') {
            let seg = percent_decode_str(raw)
                .decode_utf8()
                .map_err(|_| ScopeError::BadEncoding { value: value() })?;
            if seg.contains(['/', '\\', '\0']) {
                return Err(ScopeError::BadEncoding { value: value() });
            }
            decoded.push(seg.into_owned());
        }
        Self::normalize(decoded, uri)
    }

    /// Parses an absolute filesystem path, or a `file:` URI.
    pub fn from_path_or_uri(value: &str) -> Result<Self, ScopeError> {
        if value.starts_with("file:") {
            return Self::from_file_uri(value);
        }
        if !value.starts_with('/') || value.contains('\0') {
            return Err(ScopeError::NotFileUri {
                value: value.to_owned(),
            });
        }
        Self::normalize(value.split('/').map(str::to_owned).collect(), value)
    }

    fn normalize(segments: Vec<String>, original: &str) -> Result<Self, ScopeError> {
        let mut components: Vec<String> = Vec::new();
        for seg in segments {
            match seg.as_str() {
                "" | "." => {}
                ".." => {
                    if components.pop().is_none() {
                        return Err(ScopeError::AboveRoot {
                            value: original.to_owned(),
                        });
                    }
                }
                _ => components.push(seg),
            }
        }
        Ok(Self { components })
    }

    /// Whether `other` is this scope or lies below it (component boundary).
    pub fn contains(&self, other: &Scope) -> bool {
        other.components.len() >= self.components.len()
            && self.components[..] == other.components[..self.components.len()]
    }

    /// The canonical `file:` URI of this scope.
    pub fn to_uri(&self) -> String {
        let mut s = String::from("file://");
        if self.components.is_empty() {
            s.push('/');
        }
        for c in &self.components {
            s.push('/');
            s.extend(utf8_percent_encode(c, PATH_SEGMENT));
        }
        s
    }

    /// The filesystem path of this scope.
    pub fn to_path(&self) -> PathBuf {
        let mut p = PathBuf::from("/");
        for c in &self.components {
            p.push(c);
        }
        p
    }

    /// The scope of a filesystem path (already absolute and normalized by the OS).
    pub fn from_fs_path(path: &Path) -> Result<Self, ScopeError> {
        let s = path.to_str().ok_or_else(|| ScopeError::BadEncoding {
            value: path.to_string_lossy().into_owned(),
        })?;
        Self::from_path_or_uri(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(u: &str) -> Scope {
        Scope::from_file_uri(u).unwrap()
    }

    #[test]
    fn containment_is_by_component() {
        let notes = s("file:///work/notes");
        assert!(notes.contains(&s("file:///work/notes")));
        assert!(notes.contains(&s("file:///work/notes/a/b.md")));
        assert!(notes.contains(&s("file://localhost/work/notes/")));
        assert!(!notes.contains(&s("file:///work/notes-evil/secret.md")));
        assert!(!notes.contains(&s("file:///work/notes/%2e%2e/private.md")));
        assert!(!notes.contains(&s("file:///work/notes/%2E%2E/private.md")));
        assert!(!notes.contains(&s("file:///work/notes/../private.md")));
        assert!(notes.contains(&s("file:///work/notes/sub/%2e%2e/x.md")));
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            Scope::from_file_uri("file:///work/notes%2f..%2fprivate.md"),
            Err(ScopeError::BadEncoding { .. })
        ));
        assert!(matches!(
            Scope::from_file_uri("file:///work/notes/%5c..%5cx"),
            Err(ScopeError::BadEncoding { .. })
        ));
        assert!(matches!(
            Scope::from_file_uri("file:///work/%00"),
            Err(ScopeError::BadEncoding { .. })
        ));
        assert!(matches!(
            Scope::from_file_uri("file:///work/%ff"),
            Err(ScopeError::BadEncoding { .. })
        ));
        assert!(matches!(
            Scope::from_file_uri("https://example.com/work"),
            Err(ScopeError::NotFileUri { .. })
        ));
        assert!(matches!(
            Scope::from_file_uri("file://evil.example/work"),
            Err(ScopeError::Unsupported { .. })
        ));
        assert!(matches!(
            Scope::from_file_uri("file:///../../etc"),
            Err(ScopeError::AboveRoot { .. })
        ));
        assert!(Scope::from_path_or_uri("relative/path").is_err());
    }

    #[test]
    fn canonical_uri() {
        assert_eq!(s("file:///a/./b/../c%20d").to_uri(), "file:///a/c%20d");
        assert_eq!(s("file:///a/c%20d").to_path(), PathBuf::from("/a/c d"));
        assert_eq!(
            Scope::from_path_or_uri("/srv/repo/").unwrap().to_uri(),
            "file:///srv/repo"
        );
    }
}
