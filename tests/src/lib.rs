//! Shared pieces of the cross-crate tests: fixture paths. Generators live in `wasmsched-sim`.

/// Paths of the guest fixtures built by `build.rs`.
pub mod fixtures {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

    /// Read a fixture.
    pub fn read(path: &str) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
    }
}
