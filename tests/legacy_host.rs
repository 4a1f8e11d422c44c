//! The scripted legacy host (`examples/legacy_host.rs`) against `dualera up`: the
//! gateway and the modern server as a user runs them.

#[path = "../examples/legacy_host.rs"]
#[allow(dead_code, unreachable_pub)]
mod legacy_host;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Up {
    child: Child,
    gateway: String,
    workspace: String,
    repo: String,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_up(dir: &std::path::Path) -> Up {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dualera"))
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--dir",
        ])
        .arg(dir)
        .env("DUALERA_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dualera up");
    let out = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let (mut gateway, mut workspace, mut repo) = (None, None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while gateway.is_none() || workspace.is_none() || repo.is_none() {
        assert!(
            Instant::now() < deadline,
            "dualera up did not print its layout"
        );
        let Some(Ok(line)) = lines.next() else {
            panic!("dualera up exited early");
        };
        let value = line
            .split_whitespace()
            .last()
            .unwrap_or_default()
            .to_owned();
        if line.contains("gateway (") {
            gateway = Some(value);
        } else if line.contains("notes workspace:") {
            workspace = Some(value);
        } else if line.contains("repository:") {
            repo = Some(value);
        }
    }
    // Keep draining stdout so the child never writes into a closed pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    Up {
        child,
        gateway: gateway.unwrap_or_default(),
        workspace: workspace.unwrap_or_default(),
        repo: repo.unwrap_or_default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_legacy_host_against_up() {
    let guard = tempfile::Builder::new()
        .prefix("dualera-legacy-host-")
        .tempdir()
        .expect("temp dir");
    // `up --dir` makes the directory itself.
    let up = start_up(&guard.path().join("up"));
    let result = legacy_host::run(&up.gateway, &up.workspace, &up.repo, false).await;
    drop(up);
    if let Err(e) = result {
        panic!("legacy host script failed: {e}");
    }
}
