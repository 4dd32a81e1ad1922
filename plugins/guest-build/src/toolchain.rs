//! Makes sure the toolchain cargo runs under can build for [`TARGET`] before any guest compiles.
//!
//! rustup installs the targets listed in `rust-toolchain.toml` only when it installs the toolchain
//! itself: a machine that already had the pinned toolchain (most CI images, many laptops) lacks the
//! Wasm target, and the nested build then failed with "can't find crate for `std`" — after the
//! outer build had spent minutes on the third-party crates it was running beside it. So the guest
//! build looks for the target's standard library first, installs it through rustup for the very
//! toolchain this build runs under when it is missing, and otherwise stops at once with the one
//! command that fixes it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::TARGET;

/// How long `rustup target add` may take (a ~25 MB download) before the build gives up on it.
const INSTALL_LIMIT: Duration = Duration::from_secs(300);

/// What the build found out about the target; `Err` is the message the build stops with.
pub(crate) fn ensure_target(log_dir: &Path) -> Result<Option<String>, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let libdir = target_libdir(&rustc)?;
    if has_std(&libdir) {
        return Ok(None);
    }
    let Some(rustup) = rustup() else {
        return Err(format!(
            "the {TARGET} standard library, which the built-in policies are compiled for, is not installed \
             for {rustc} (looked in {}), and no rustup was found to install it.\n\
             Fix: install rustup (https://rustup.rs) and run `rustup toolchain install` in the checkout, \
             or install the {TARGET} standard library for this rustc the way it was installed.",
            libdir.display()
        ));
    };
    let toolchain = toolchain(&rustc)?;
    let fix = format!("rustup target add --toolchain {toolchain} {TARGET}");

    // Two build scripts (the plugins' and the tests') and scripts/rustc-wrapper can get here at
    // once: one installs, the others wait for it and then find the target there. The lock is the
    // toolchain's, the file the wrapper takes too.
    let rustlib = libdir.parent().and_then(Path::parent).filter(|d| writable(d));
    let lock_path = match rustlib {
        Some(dir) => dir.join(format!(".wasmsched-{TARGET}-install.lock")),
        None => std::env::temp_dir().join(format!("wasmsched-{TARGET}-install.lock")),
    };
    let lock = std::fs::File::create(&lock_path).map_err(|e| format!("create {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
    if has_std(&libdir) {
        return Ok(None);
    }

    std::fs::create_dir_all(log_dir).map_err(|e| format!("create {}: {e}", log_dir.display()))?;
    let log = log_dir.join(format!(".{TARGET}-install.log"));
    let installed =
        run_with_limit(Command::new(&rustup).args(["target", "add", "--toolchain", &toolchain, TARGET]), &log);
    match installed {
        Ok(()) if has_std(&libdir) => Ok(Some(format!(
            "installed the {TARGET} target (the built-in policies are compiled for it) into toolchain {toolchain}: `{fix}`"
        ))),
        Ok(()) => Err(format!(
            "`{fix}` succeeded but {} still has no standard library for {TARGET}; the toolchain cargo runs \
             under ({rustc}) may not be the one rustup installed into.",
            libdir.display()
        )),
        Err(why) => Err(format!(
            "the {TARGET} target, which the built-in policies are compiled for, is not installed for toolchain \
             {toolchain}, and installing it failed:\n{why}\n\
             Fix (it needs the network once): {fix}"
        )),
    }
}

fn writable(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| !m.permissions().readonly())
}

/// Where `rustc` keeps the target's libraries; it names the directory whether or not it exists.
fn target_libdir(rustc: &str) -> Result<PathBuf, String> {
    let out = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .map_err(|e| format!("run {rustc}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{rustc} does not know the {TARGET} target (too old? rust-toolchain.toml pins the one it needs):\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn has_std(libdir: &Path) -> bool {
    std::fs::read_dir(libdir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libstd-") && name.ends_with(".rlib")
        })
    })
}

/// rustup, if this build runs under it: on `PATH`, or in cargo's home where its installer puts it.
fn rustup() -> Option<PathBuf> {
    let works = |p: &Path| {
        Command::new(p).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    let on_path = PathBuf::from("rustup");
    if works(&on_path) {
        return Some(on_path);
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    Some(cargo_home.join("bin/rustup")).filter(|p| works(p))
}

/// The toolchain this build runs under: rustup names it to the processes it starts; without that,
/// the sysroot's directory is the toolchain's name (`~/.rustup/toolchains/<name>`).
fn toolchain(rustc: &str) -> Result<String, String> {
    if let Ok(name) = std::env::var("RUSTUP_TOOLCHAIN")
        && !name.is_empty()
    {
        return Ok(name);
    }
    let out = Command::new(rustc).args(["--print", "sysroot"]).output().map_err(|e| format!("run {rustc}: {e}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    sysroot
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| format!("cannot tell which rustup toolchain {rustc} belongs to (sysroot {})", sysroot.display()))
}

/// Runs `cmd` to completion within [`INSTALL_LIMIT`], its messages into `log`; `Err` carries the
/// last of them.
fn run_with_limit(cmd: &mut Command, log: &Path) -> Result<(), String> {
    let log_file = std::fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("start rustup: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > INSTALL_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("rustup did not finish within {} s", INSTALL_LIMIT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("wait for rustup: {e}")),
        }
    };
    if status.success() {
        return Ok(());
    }
    let said = std::fs::read_to_string(log).unwrap_or_default();
    let mut tail: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).rev().take(6).collect();
    tail.reverse();
    Err(format!("rustup exited with {status}:\n{}", tail.join("\n")))
}
