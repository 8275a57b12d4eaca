//! A 1 MiB stack for this component (the guest workspace gives plugins 64 KiB): the parser
//! descends once per nesting level of an answer, up to `parse::MAX_DEPTH` levels.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-zstack-size=1048576");
}
