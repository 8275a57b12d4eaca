//! CRuby as a code runner: ruby.wasm as the ruby.wasm project ships it (npm
//! `@ruby/3.4-wasm-wasi`), a WASI 0.1 *core module* rather than a component, driven by the
//! host through the functions it exports for its JavaScript embedders.
//!
//! Why not a component like the other runners: CRuby's build for WebAssembly (wasi-sdk,
//! asyncify for its setjmp and stack scans, wasi-vfs for the standard library) is the
//! ruby.wasm project's own toolchain, which cannot be rebuilt here; its module is the
//! interpreter people run. The host gives it exactly what a component runner gets — the
//! same store, limits, deadline, fuel, bounded stdout and stderr, and the run's directory as
//! `/` — through WASI 0.1 instead of 0.2, and every import that is not WASI (its JavaScript
//! bridge, reached only by `require "js"`) traps.
//!
//! A run, in a fresh instance: `_initialize`; `ruby-init` with `ruby --disable-gems -e_=0`
//! (boots the VM and parses nothing); then `rb-eval-string-protect` of a prelude that makes
//! `ARGV` and `$0`, evaluates the program as `program.rb` at the top level, prints an
//! uncaught exception as `ruby` does (its full message, exit status 1), keeps `exit n`'s
//! status, and ends the instance with `exit!` (WASI's `proc_exit`, which carries the whole
//! status) so that nothing of the program can run after it.

use crate::call::HostState;
use wasmtime::{Instance, Module, Store};

/// The exports that make a core module the ruby.wasm reactor (its names carry their types,
/// as wit-bindgen's first canonical ABI spelt them).
const INIT: &str = "ruby-init: func(args: list<string>) -> ()";
const EVAL: &str = "rb-eval-string-protect: func(str: string) -> tuple<handle<rb-abi-value>, s32>";
const EXPECTED: [&str; 5] = ["memory", "_initialize", "cabi_realloc", INIT, EVAL];

/// The file name a program runs as (in backtraces and `__FILE__`), like `program.lua`.
pub(crate) const PROGRAM_NAME: &str = "program.rb";

/// Whether `module` is the ruby.wasm reactor this module drives; `Err` names what is missing.
pub(crate) fn check(module: &Module) -> Result<(), String> {
    let missing: Vec<&str> =
        EXPECTED.iter().copied().filter(|name| module.exports().all(|export| export.name() != *name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "it is a core WebAssembly module, not a component: build it for wasm32-wasip2, or wrap it \
         with `wasm-tools component new` (the one core module wirl runs is CRuby's ruby.wasm, as a \
         code runner; this one lacks its export{} {})",
        if missing.len() == 1 { "" } else { "s" },
        missing.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
    ))
}

/// Run `source` with `args` in `instance` (fresh); it ends with the program's exit status
/// as WASI's `I32Exit` error, or with the trap or cut that stopped it.
pub(crate) async fn run(
    store: &mut Store<HostState>,
    instance: Instance,
    source: &str,
    args: &[String],
) -> wasmtime::Result<std::convert::Infallible> {
    let memory = instance
        .get_memory(&mut *store, "memory")
        .ok_or_else(|| wasmtime::format_err!("ruby.wasm exports no memory"))?;
    let realloc = instance.get_typed_func::<(i32, i32, i32, i32), i32>(&mut *store, "cabi_realloc")?;
    let initialize = instance.get_typed_func::<(), ()>(&mut *store, "_initialize")?;
    let init = instance.get_typed_func::<(i32, i32), ()>(&mut *store, INIT)?;
    let eval = instance.get_typed_func::<(i32, i32), i32>(&mut *store, EVAL)?;

    // A string in the guest's memory, NUL-terminated too: ruby-init reads C strings.
    async fn place(
        store: &mut Store<HostState>,
        memory: wasmtime::Memory,
        realloc: &wasmtime::TypedFunc<(i32, i32, i32, i32), i32>,
        bytes: &[u8],
        align: i32,
    ) -> wasmtime::Result<(i32, i32)> {
        let len = i32::try_from(bytes.len()).map_err(|_| wasmtime::format_err!("the program is too large"))?;
        let at = realloc.call_async(&mut *store, (0, 0, align, len + 1)).await?;
        memory.write(&mut *store, at as u32 as usize, bytes)?;
        memory.write(&mut *store, at as u32 as usize + bytes.len(), &[0])?;
        Ok((at, len))
    }

    initialize.call_async(&mut *store, ()).await?;
    let mut pairs = Vec::new();
    for arg in ["ruby", "--disable-gems", "-e_=0"] {
        let (at, len) = place(store, memory, &realloc, arg.as_bytes(), 1).await?;
        pairs.extend_from_slice(&at.to_le_bytes());
        pairs.extend_from_slice(&len.to_le_bytes());
    }
    let (list, _) = place(store, memory, &realloc, &pairs, 4).await?;
    init.call_async(&mut *store, (list, 3)).await?;
    let prelude = prelude(source, args);
    let (at, len) = place(store, memory, &realloc, prelude.as_bytes(), 1).await?;
    eval.call_async(&mut *store, (at, len)).await?;
    // The prelude ends in `exit!`: returning means Ruby could not even run it.
    Err(wasmtime::format_err!("ruby returned without exiting (its prelude failed)"))
}

/// The Ruby that runs a program: the program and its arguments travel as hex, so that no
/// byte of them is ever read as Ruby syntax of the prelude.
fn prelude(source: &str, args: &[String]) -> String {
    let args: Vec<String> = args.iter().map(|arg| format!("\"{}\"", hex::encode(arg))).collect();
    format!(
        r#"Encoding.default_external = Encoding::UTF_8
$stdout.sync = true
$stderr.sync = true
ARGV.replace([{args}].map {{ |h| [h].pack("H*").force_encoding(Encoding::UTF_8) }})
$0 = "{PROGRAM_NAME}"
status = begin
  TOPLEVEL_BINDING.eval(["{source}"].pack("H*").force_encoding(Encoding::UTF_8), "{PROGRAM_NAME}", 1)
  0
rescue SystemExit => e
  e.status
rescue Exception => e
  $stderr.write(e.full_message(highlight: false))
  1
end
$stdout.flush
$stderr.flush
exit!(status)
"#,
        args = args.join(", "),
        source = hex::encode(source),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prelude_carries_program_and_arguments_as_hex_only() {
        let prelude = super::prelude("puts \"}]) ; exit!(3)", &["a\"b".into()]);
        assert!(!prelude.contains("exit!(3)"), "the program's bytes never appear as Ruby");
        assert!(prelude.contains(&hex::encode("a\"b")));
        assert!(prelude.contains(&hex::encode("puts \"}]) ; exit!(3)")));
    }
}
