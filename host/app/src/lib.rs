//! wirl's application layer: what each command does, as calls a program can make — a
//! training started or resumed (`train`: its config and overrides, the plugin policy of a
//! resume, the data-parallel ranks of `ranks`, its control socket, `--watch`, `--serve`),
//! `wirl serve` and `wirl sandbox serve` composed from their settings (`serve`, `code`),
//! models found and fetched (`models`), a plugin loaded from its options (`plugins`), a new
//! plugin's files (`scaffold`), a run's charts (`plot`).
//!
//! It prints nothing and exits nothing: progress goes to the caller's `Observer`, passing
//! notices to the sink the caller installs (`notices`), results back as values. It does not
//! parse a command line (its option types derive their flags, which the CLI parses), handle
//! signals (the caller says when to stop), or know the terminal.

pub mod check;
pub mod code;
pub mod control_socket;
pub mod device;
pub mod generate;
pub mod models;
pub mod notices;
pub mod plot;
pub mod plugins;
pub mod ranks;
pub mod scaffold;
pub mod score;
pub mod serve;
pub mod train;
pub mod watch;
