//! The embedded default: a sample notes workspace, a sample repository and a config
//! granting the local principal both, created on first use and left alone after.

use crate::config::StoreSection;
use crate::server::scope::Scope;
use crate::server::store;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Where the demo's pieces are.
#[derive(Debug, Clone)]
pub struct DemoLayout {
    /// The demo folder (canonical).
    pub dir: PathBuf,
    /// The config file written for the demo.
    pub config: PathBuf,
    /// `file:` URI of the notes workspace.
    pub notes_uri: String,
    /// The sample repository directory.
    pub repo_dir: PathBuf,
}

const REPO_FILES: &[(&str, &str)] = &[
    ("README.md", "# tinyledger\n\nA tiny double-entry ledger library with a command-line front end.\nRecords postings, checks that every transaction balances, and prints balances per account.\n"),
    ("Cargo.toml", "[package]\nname = \"tinyledger\"\nversion = \"0.3.1\"\nedition = \"2021\"\n"),
    ("src/lib.rs", "//! Double-entry bookkeeping: accounts, postings, balanced transactions.\n\npub struct Posting { pub account: String, pub cents: i64 }\n\npub fn balanced(postings: &[Posting]) -> bool {\n    postings.iter().map(|p| p.cents).sum::<i64>() == 0\n}\n"),
    ("src/main.rs", "fn main() {\n    println!(\"tinyledger: pass a journal file\");\n}\n"),
    ("docs/intro.md", "# Introduction\n\nEvery transaction must balance: the postings of one transaction sum to zero.\n"),
];

const NOTES: &[(&str, &str)] = &[
    (
        "TPS report",
        "Q3 TPS report draft: cover sheet still missing.",
    ),
    (
        "TPS report",
        "TPS report for the Initech account, sent to Lumbergh.",
    ),
    (
        "TPS report",
        "Old TPS report template (pre-2026). Safe to remove.",
    ),
    (
        "Standup",
        "Monday standup: ledger import is blocked on the parser.",
    ),
    ("Ideas", "Add a roots-free workspace picker to the host."),
];

/// Creates the demo under `dir` if it is not there yet, and returns its layout.
pub fn ensure(dir: &Path) -> io::Result<DemoLayout> {
    fs::create_dir_all(dir)?;
    let dir = fs::canonicalize(dir)?;
    let notes_dir = dir.join("notes");
    let repo_dir = dir.join("repo");
    fs::create_dir_all(&notes_dir)?;
    for (rel, text) in REPO_FILES {
        let p = repo_dir.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        if !p.exists() {
            fs::write(&p, text)?;
        }
    }
    let notes_uri = Scope::from_fs_path(&notes_dir)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?
        .to_uri();
    let config = dir.join("dualera.toml");
    if !config.exists() {
        let text = format!(
            "# Written by `dualera` for the demo; edit freely.\n\
             [store]\npath = \"dualera.db\"\n\n\
             # The migration report, kept across restarts.\n\
             [report]\npath = \"dualera-report.db\"\n\n\
             [[grants]]\nprincipal = \"local\"\nworkspaces = [{notes:?}]\nrepositories = [{repo:?}]\n",
            notes = notes_uri,
            repo = repo_dir.to_string_lossy(),
        );
        fs::write(&config, text)?;
    }
    // The store the server will open: the demo's SQLite file, or DUALERA_STORE_URL.
    let section = StoreSection {
        path: dir.join("dualera.db").to_string_lossy().into_owned(),
        ..StoreSection::default()
    };
    let store = store::open(&section).map_err(|e| io::Error::other(e.to_string()))?;
    if store
        .count(&notes_uri)
        .map_err(|e| io::Error::other(e.to_string()))?
        == 0
    {
        for (title, body) in NOTES {
            store
                .create(&notes_uri, title, body)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
    }
    Ok(DemoLayout {
        dir: dir.clone(),
        config,
        notes_uri,
        repo_dir,
    })
}

/// The demo's TLS material (`dualera up --tls`).
#[derive(Debug, Clone)]
pub struct DemoTls {
    /// The throw-away CA certificate to give to hosts.
    pub ca: PathBuf,
    /// The gateway's certificate chain.
    pub cert: PathBuf,
    /// The gateway's private key.
    pub key: PathBuf,
}

/// Creates (once) a throw-away CA and a certificate for `localhost`, `127.0.0.1` and
/// `::1` signed by it, under `dir/tls/`. The CA's key is never written: nothing else
/// can be signed by it once this returns.
#[cfg(feature = "tls")]
pub fn ensure_tls(dir: &Path) -> io::Result<DemoTls> {
    let tls_dir = dir.join("tls");
    let out = DemoTls {
        ca: tls_dir.join("ca.pem"),
        cert: tls_dir.join("gateway.pem"),
        key: tls_dir.join("gateway-key.pem"),
    };
    if out.ca.exists() && out.cert.exists() && out.key.exists() {
        return Ok(out);
    }
    fs::create_dir_all(&tls_dir)?;
    let ca = crate::tls::ThrowawayCa::new("dualera demo CA (throw-away)")
        .map_err(|e| io::Error::other(e.to_string()))?;
    let (cert, key) = ca
        .issue(
            &["localhost", "127.0.0.1", "::1"],
            crate::tls::Validity::Current,
        )
        .map_err(|e| io::Error::other(e.to_string()))?;
    fs::write(&out.ca, ca.cert_pem())?;
    fs::write(&out.cert, cert)?;
    write_private(&out.key, key.as_bytes())?;
    Ok(out)
}

/// Refuses: serving TLS is the `tls` feature.
#[cfg(not(feature = "tls"))]
pub fn ensure_tls(_dir: &Path) -> io::Result<DemoTls> {
    Err(io::Error::other(crate::parts::NotBuilt::new("tls")))
}

#[cfg(feature = "tls")]
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.write_all(bytes)
    }
    #[cfg(not(unix))]
    {
        fs::write(path, bytes)
    }
}
