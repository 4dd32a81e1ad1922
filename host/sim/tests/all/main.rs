//! The simulator crate's integration tests, as one binary: each extra test binary links the
//! crate's dependencies again, which is most of a clean test build's time.

mod fgd_paper;
mod timed;
