//! `dualera vectors …` in a build without the `kit` feature: the subcommand is still
//! known, so asking for it says which feature brings it instead of "unrecognized
//! subcommand".

use clap::Subcommand;
use dualera::parts::NotBuilt;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(crate) enum VectorsCommand {
    /// Whatever was asked: refused.
    #[command(external_subcommand)]
    Any(Vec<String>),
}

/// Refuses with exit status 2, as `vectors run` does for a run it cannot carry out.
pub(crate) fn main(command: VectorsCommand, _runtime: &tokio::runtime::Runtime) -> ExitCode {
    use std::io::Write as _;
    let VectorsCommand::Any(args) = command;
    let asked = args.first().map_or("", String::as_str);
    let line = format!("dualera: vectors {asked}: {}\n", NotBuilt::new("kit"));
    let _ = std::io::stderr().write_all(line.as_bytes());
    ExitCode::from(2)
}
