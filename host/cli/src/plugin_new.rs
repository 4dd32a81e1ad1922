//! `wasmsched plugin new NAME --lang rust|python|js`: a buildable policy project with a passing test
//! of its behaviour, a build script that makes the component and pins it in a policy set, and
//! (Python, JavaScript) its own copies of the SDK and the contract, so it builds outside this
//! repository.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The language of a new policy.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Lang {
    /// A crate on the Rust SDK (`sdk/`), built for `wasm32-wasip2`.
    Rust,
    /// A module on the Python SDK (`sdk/python`), built with componentize-py 0.25.1.
    Python,
    /// A module on the JavaScript SDK (`sdk/js`), built with componentize-js 0.23.0.
    Js,
}

/// Arguments of `plugin new`.
#[derive(clap::Args)]
pub struct Args {
    /// The policy's name (lower-case letters, digits and `-`, starting with a letter).
    name: String,
    /// Its language.
    #[arg(long, value_enum)]
    lang: Lang,
    /// Where to write it (default: ./NAME); must not exist or be empty.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Rust: the wasmsched SDK crate to depend on (the `sdk` directory of a checkout), as written
    /// in Cargo.toml (relative to the new project, or absolute).
    #[arg(long, required_if_eq("lang", "rust"))]
    sdk: Option<String>,
}

const CONTRACT: &str = include_str!("../../../wit/policy.wit");
const PYTHON_SDK: &str = include_str!("../../../sdk/python/wasmsched_policy.py");
const TOOLCHAIN: &str = include_str!("../../../rust-toolchain.toml");
const JS_SDK: &str = include_str!("../../../sdk/js/wasmsched_policy.js");
const JS_BUILD: &str = include_str!("../../../sdk/js/build.mjs");
const JS_PACKAGE: &str = include_str!("../../../sdk/js/package.json");
const JS_LOCK: &str = include_str!("../../../sdk/js/package-lock.json");

pub fn run(args: Args) -> anyhow::Result<()> {
    let name = args.name.as_str();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.len() <= 63;
    if !valid {
        bail!("{name:?} is not a policy name: lower-case letters, digits and `-`, starting with a letter");
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() && std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?.next().is_some() {
        bail!("{} exists and is not empty: nothing written", dir.display());
    }
    let fill = |template: &str| template.replace("{{NAME}}", name).replace("{{CRATE}}", &name.replace('-', "_"));
    let files: Vec<(&str, String, bool)> = match args.lang {
        Lang::Python => vec![
            ("app.py", fill(include_str!("../templates/python/app.py")), false),
            ("test_app.py", fill(include_str!("../templates/python/test_app.py")), false),
            ("build.sh", fill(include_str!("../templates/python/build.sh")), true),
            ("wasmsched_policy.py", PYTHON_SDK.to_string(), false),
            ("wit/policy.wit", CONTRACT.to_string(), false),
        ],
        Lang::Js => vec![
            ("app.js", fill(include_str!("../templates/js/app.js")), false),
            ("app.test.mjs", fill(include_str!("../templates/js/app.test.mjs")), false),
            ("build.sh", fill(include_str!("../templates/js/build.sh")), true),
            ("wasmsched_policy.js", JS_SDK.to_string(), false),
            ("build.mjs", JS_BUILD.to_string(), false),
            ("package.json", JS_PACKAGE.to_string(), false),
            ("package-lock.json", JS_LOCK.to_string(), false),
            ("wit/policy.wit", CONTRACT.to_string(), false),
        ],
        Lang::Rust => {
            let sdk = args.sdk.as_deref().unwrap_or_default();
            vec![
                ("Cargo.toml", fill(include_str!("../templates/rust/Cargo.toml")).replace("{{SDK}}", sdk), false),
                ("src/lib.rs", fill(include_str!("../templates/rust/lib.rs")), false),
                ("build.sh", fill(include_str!("../templates/rust/build.sh")), true),
                ("rust-toolchain.toml", TOOLCHAIN.to_string(), false),
            ]
        }
    };
    for (path, text, executable) in &files {
        write(&dir.join(path), text, *executable)?;
    }
    println!("wrote {} ({:?}): {}", dir.display(), args.lang, files.iter().map(|f| f.0).collect::<Vec<_>>().join(", "));
    println!("next:   {}/build.sh test && wasmsched plugin check {}/{name}.wasm", dir.display(), dir.display());
    Ok(())
}

fn write(path: &Path, text: &str, executable: bool) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    if executable {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))?;
    }
    Ok(())
}
