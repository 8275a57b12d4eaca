//! Paths of the guest components that the tests load, one constant per guest
//! (`MATH_ANSWER`, `HOSTILE`, …), built by this crate's build script.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));
