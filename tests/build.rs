//! Compiles the guest fixtures (hostile ones included) and the example plugins to components, and
//! writes their paths into `fixtures.rs`.

use std::fmt::Write;

fn main() {
    let mut consts = String::new();
    for (package, wasm) in wasmsched_guest_build::build(&[
        "wasmsched-fixture-hostile",
        "wasmsched-fixture-raw-garbage",
        "wasmsched-fixture-legacy-mirror",
        "wasmsched-fixture-wrong-contract",
        "wasmsched-fixture-wrong-signature",
        "wasmsched-example-gpu-model-affinity",
        "wasmsched-example-gpu-model-filter",
    ]) {
        let name = package
            .trim_start_matches("wasmsched-fixture-")
            .trim_start_matches("wasmsched-example-")
            .replace('-', "_")
            .to_uppercase();
        writeln!(
            consts,
            "/// Component built from `{package}`.\npub const {name}: &str = {:?};",
            wasm.display().to_string()
        )
        .unwrap();
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("fixtures.rs"), consts).unwrap();
}
