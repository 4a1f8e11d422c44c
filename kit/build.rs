//! Embeds the transcript vectors (`../adapters/vectors/*.json`) so that an installed
//! `dualera vectors run` carries its suite with it.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/vectors");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut out = String::from("/// The vectors embedded at build time: (name, text).\npub(crate) const EMBEDDED: &[(&str, &str)] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_stem().unwrap_or_default().to_string_lossy();
        let path = f.canonicalize().unwrap_or_else(|_| f.clone());
        let _ = writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            path.display().to_string()
        );
    }
    out.push_str("];\n");
    let target = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("embedded.rs");
    std::fs::write(target, out).expect("write embedded.rs");
}
