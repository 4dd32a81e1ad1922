//! The events crate's integration tests, as one binary: each extra test binary links the
//! crate's dependencies again, which is most of a clean test build's time.

#[cfg(feature = "decisions")]
mod decisions;
mod nats;
#[cfg(feature = "cli")]
mod panic;
mod schema;
mod sink;
mod support;
