//! The tutorials (`docs/tutorial.md`, `docs/tutorial-python.md`, `docs/tutorial-javascript.md`), followed literally: their
//! `file=PATH` blocks are written and their `sh run` blocks run with bash, in order, in a fresh
//! directory outside the repository (beside a `wasmsched` link to this checkout, as the tutorials
//! lay things out), with the `wasmsched` under test first on `PATH`. A tutorial that drifts from
//! the code fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

const TUTORIAL: &str = include_str!("../../../../docs/tutorial.md");
const TUTORIAL_PYTHON: &str = include_str!("../../../../docs/tutorial-python.md");
const TUTORIAL_JAVASCRIPT: &str = include_str!("../../../../docs/tutorial-javascript.md");

/// A fenced block the test acts on.
enum Step {
    File { path: String, text: String },
    Run { script: String },
}

fn steps(markdown: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        let text = body.join("\n") + "\n";
        let words: Vec<&str> = info.split_whitespace().collect();
        if let Some(path) = words.iter().find_map(|w| w.strip_prefix("file=")) {
            steps.push(Step::File { path: path.to_string(), text });
        } else if words == ["sh", "run"] {
            steps.push(Step::Run { script: text });
        }
    }
    steps
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs the tutorial's steps; returns what they printed.
fn follow(tutorial: &str) -> String {
    let steps = steps(tutorial);
    let runs = steps.iter().filter(|s| matches!(s, Step::Run { .. })).count();
    assert!(runs >= 4, "the tutorial's `sh run` blocks were not found ({runs})");

    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo_root(), work.path().join("wasmsched")).unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_wasmsched")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();

    let mut transcript = String::new();
    for step in steps {
        match step {
            Step::File { path, text } => {
                let file = work.path().join(&path);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(&file, text).unwrap();
            }
            Step::Run { script } => {
                let out = Command::new("bash")
                    .args(["-euo", "pipefail", "-c", &script])
                    .current_dir(work.path())
                    .env("PATH", &path)
                    // The tutorial's crate is outside this workspace: its own target directory,
                    // and no toolchain override inherited from the test run.
                    .env_remove("CARGO_TARGET_DIR")
                    .env_remove("RUSTUP_TOOLCHAIN")
                    .env_remove("CARGO")
                    // A compiled-component cache of its own, as a reader's first run has: a
                    // component is compiled once, then loaded from it.
                    .env("WASMSCHED_CACHE_DIR", work.path().join("compiled"))
                    // Python writes no bytecode into the checkout it reads the SDK from.
                    .env("PYTHONDONTWRITEBYTECODE", "1")
                    .output()
                    .unwrap();
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                transcript.push_str(&format!("$ {script}{stdout}"));
                assert!(out.status.success(), "step failed:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}");
            }
        }
    }
    transcript
}

/// The line of `simulate`'s summary: something placed, nothing failed by a fault.
fn assert_placed(transcript: &str) {
    let placed = transcript.lines().find(|l| l.starts_with("placed ")).expect("simulate's summary line");
    assert!(!placed.starts_with("placed 0,") && placed.contains("(0 by plugin faults)"), "{placed}");
}

/// The rollout step: the set went live as version 2 in the middle of the replay, made decisions,
/// and the events name it (the `grep -c` step fails on none).
fn assert_rolled_out(transcript: &str, set: &str) {
    let line = transcript
        .lines()
        .find(|l| l.starts_with(&format!("policy set {set}@2 from 300 s: ")))
        .unwrap_or_else(|| panic!("no rollout of {set}: {transcript}"));
    assert!(!line.contains(": 0 decisions"), "{line}");
    assert!(transcript.contains("policy set fgd@1 from 0 s: "), "{transcript}");
}

#[test]
fn the_tutorial_ends_in_a_running_policy() {
    let transcript = follow(TUTORIAL);
    // What the tutorial says the reader sees.
    assert!(transcript.contains("test result: ok. 2 passed") || transcript.contains("2 passed"), "{transcript}");
    assert!(transcript.contains("plugin   prefer-empty-gpus (registered here as my_policy)"), "{transcript}");
    assert!(transcript.contains("policy set spread-idle passes every gate"), "{transcript}");
    assert!(transcript.contains("policy set spread-idle"), "{transcript}");
    assert_placed(&transcript);
    assert_rolled_out(&transcript, "spread-idle");
}

#[test]
fn the_python_tutorial_ends_in_a_running_policy() {
    let transcript = follow(TUTORIAL_PYTHON);
    assert!(transcript.contains("Ran 2 tests") && transcript.contains("\nOK"), "{transcript}");
    assert!(transcript.contains("plugin   prefer-empty-gpus (registered here as policy)"), "{transcript}");
    assert!(transcript.contains("sdk      wasmsched-python/0.1.0"), "{transcript}");
    assert!(transcript.contains("policy set spread-idle-py passes every gate"), "{transcript}");
    assert_placed(&transcript);
    assert_rolled_out(&transcript, "spread-idle-py");
}

#[test]
fn the_javascript_tutorial_ends_in_a_running_policy() {
    let transcript = follow(TUTORIAL_JAVASCRIPT);
    assert!(transcript.contains("# pass 2") && transcript.contains("# fail 0"), "{transcript}");
    assert!(transcript.contains("plugin   prefer-empty-gpus (registered here as policy)"), "{transcript}");
    assert!(transcript.contains("sdk      wasmsched-js/0.1.0"), "{transcript}");
    assert!(transcript.contains("policy set spread-idle-js passes every gate"), "{transcript}");
    assert_placed(&transcript);
    assert_rolled_out(&transcript, "spread-idle-js");
}
