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
//!
//! Booting CRuby (`_initialize` + `ruby-init`) takes ~75 ms; a program, ~2 ms. So the boot
//! runs once per runner and is kept as a [`Snapshot`]: the 4 KiB pages of linear memory it
//! changed (~1.3 MiB of 66), the memory's size, and the module's mutable globals (the shadow
//! stack pointer, asyncify's state), which the module does not export — [`export_globals`]
//! rewrites it at load to export them, as wizer does. A run instantiates afresh, writes the
//! snapshot back and evaluates its prelude. What lives outside the instance is the same at
//! boot and at every run by construction: WASI's preopens (`/` is always preopened — the
//! run's directory, or an empty read-only one — since wasi-libc keeps its preopen table in
//! memory) and no open host files (ruby-init opens none of the host's). The prelude reseeds
//! `Random` (`srand`), which the boot seeded once for every run.

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

/// The prefix of the exports [`export_globals`] adds, followed by the global's index.
const GLOBAL_EXPORT: &str = "wirl-global-";

/// CRuby's instance after its boot, to start every run from.
pub(crate) struct Snapshot {
    /// The memory's size after the boot, in bytes.
    memory_bytes: usize,
    /// The pages the boot changed: (offset, bytes), each one page long.
    pages: Vec<(usize, Box<[u8]>)>,
    /// Every mutable global, by its export name.
    globals: Vec<(String, wasmtime::Val)>,
}

const PAGE: usize = 4096;

impl Snapshot {
    /// Boot CRuby in `instance` (fresh) and keep what the boot changed.
    pub(crate) async fn boot(store: &mut Store<HostState>, instance: Instance) -> wasmtime::Result<Snapshot> {
        let memory = memory(store, instance)?;
        let fresh = memory.data(&*store).to_vec();
        let realloc = instance.get_typed_func::<(i32, i32, i32, i32), i32>(&mut *store, "cabi_realloc")?;
        let initialize = instance.get_typed_func::<(), ()>(&mut *store, "_initialize")?;
        let init = instance.get_typed_func::<(i32, i32), ()>(&mut *store, INIT)?;
        initialize.call_async(&mut *store, ()).await?;
        let mut pairs = Vec::new();
        for arg in ["ruby", "--disable-gems", "-e_=0"] {
            let (at, len) = place(store, memory, &realloc, arg.as_bytes(), 1).await?;
            pairs.extend_from_slice(&at.to_le_bytes());
            pairs.extend_from_slice(&len.to_le_bytes());
        }
        let (list, _) = place(store, memory, &realloc, &pairs, 4).await?;
        init.call_async(&mut *store, (list, 3)).await?;

        let booted = memory.data(&*store);
        let memory_bytes = booted.len();
        let pages = booted
            .chunks(PAGE)
            .enumerate()
            .filter(|(index, page)| {
                let start = index * PAGE;
                match fresh.get(start..(start + page.len()).min(fresh.len())) {
                    Some(before) if before.len() == page.len() => before != *page,
                    // Grown by the boot: only what is not zero.
                    _ => page.iter().any(|&byte| byte != 0),
                }
            })
            .map(|(index, page)| (index * PAGE, page.to_vec().into_boxed_slice()))
            .collect();
        let names: Vec<String> = instance
            .exports(&mut *store)
            .filter_map(|export| export.name().starts_with(GLOBAL_EXPORT).then(|| export.name().to_string()))
            .collect();
        let mut globals = Vec::new();
        for name in names {
            let global = instance.get_global(&mut *store, &name).expect("listed above");
            globals.push((name, global.get(&mut *store)));
        }
        Ok(Snapshot { memory_bytes, pages, globals })
    }

    /// Put this snapshot into `instance` (fresh, of the same module).
    fn restore(&self, store: &mut Store<HostState>, instance: Instance) -> wasmtime::Result<()> {
        let memory = memory(store, instance)?;
        let have = memory.data_size(&*store);
        if have < self.memory_bytes {
            let page = memory.page_size(&*store) as usize;
            memory.grow(&mut *store, ((self.memory_bytes - have) / page) as u64)?;
        }
        let data = memory.data_mut(&mut *store);
        for (offset, page) in &self.pages {
            data[*offset..offset + page.len()].copy_from_slice(page);
        }
        for (name, value) in &self.globals {
            let global = instance
                .get_global(&mut *store, name)
                .ok_or_else(|| wasmtime::format_err!("ruby.wasm lost its global export {name}"))?;
            global.set(&mut *store, *value)?;
        }
        Ok(())
    }
}

fn memory(store: &mut Store<HostState>, instance: Instance) -> wasmtime::Result<wasmtime::Memory> {
    instance.get_memory(&mut *store, "memory").ok_or_else(|| wasmtime::format_err!("ruby.wasm exports no memory"))
}

/// A string in the guest's memory, NUL-terminated too: ruby-init reads C strings.
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

/// Run `source` with `args` in `instance` (fresh) started from `snapshot`; it ends with the
/// program's exit status as WASI's `I32Exit` error, or with the trap or cut that stopped it.
pub(crate) async fn run(
    store: &mut Store<HostState>,
    instance: Instance,
    snapshot: &Snapshot,
    source: &str,
    args: &[String],
) -> wasmtime::Result<std::convert::Infallible> {
    snapshot.restore(store, instance)?;
    let memory = memory(store, instance)?;
    let realloc = instance.get_typed_func::<(i32, i32, i32, i32), i32>(&mut *store, "cabi_realloc")?;
    let eval = instance.get_typed_func::<(i32, i32), i32>(&mut *store, EVAL)?;
    let prelude = prelude(source, args);
    let (at, len) = place(store, memory, &realloc, prelude.as_bytes(), 1).await?;
    eval.call_async(&mut *store, (at, len)).await?;
    // The prelude ends in `exit!`: returning means Ruby could not even run it.
    Err(wasmtime::format_err!("ruby returned without exiting (its prelude failed)"))
}

/// `module` with an export `wirl-global-N` for each of its own mutable globals (N its index),
/// so that a snapshot can read and restore them; every other byte as it was. An error names
/// what this reader does not know (the module is then refused).
pub(crate) fn export_globals(module: &[u8]) -> Result<Vec<u8>, String> {
    let mut reader = Reader { bytes: module, at: 8 };
    if !module.starts_with(b"\0asm\x01\0\0\0") {
        return Err("not a core module".into());
    }
    let mut imported = 0u32;
    let mut mutable = Vec::new();
    let mut exports = None;
    while reader.at < module.len() {
        let start = reader.at;
        let id = reader.byte()?;
        let size = reader.leb()? as usize;
        let content = reader.at;
        let end = content.checked_add(size).filter(|&end| end <= module.len()).ok_or("a section runs past the end")?;
        match id {
            2 => imported = imported_globals(&mut Reader { bytes: &module[..end], at: content })?,
            6 => mutable = mutable_globals(&mut Reader { bytes: &module[..end], at: content })?,
            7 => exports = Some((start, content, end)),
            _ => {}
        }
        reader.at = end;
    }
    let Some((start, content, end)) = exports else {
        // Nothing to export it with, and nothing to export: as it is (it is then refused as
        // a module that is not CRuby, which has exports).
        return if mutable.is_empty() { Ok(module.to_vec()) } else { Err("it has no export section".into()) };
    };
    let mut section = Reader { bytes: &module[..end], at: content };
    let count = section.leb()?;
    let mut body = Vec::new();
    write_leb(&mut body, count + mutable.len() as u32);
    body.extend_from_slice(&module[section.at..end]);
    for index in mutable {
        let name = format!("{GLOBAL_EXPORT}{}", imported + index);
        write_leb(&mut body, name.len() as u32);
        body.extend_from_slice(name.as_bytes());
        body.push(3);
        write_leb(&mut body, imported + index);
    }
    let mut out = module[..start].to_vec();
    out.push(7);
    write_leb(&mut out, body.len() as u32);
    out.extend_from_slice(&body);
    out.extend_from_slice(&module[end..]);
    Ok(out)
}

/// How many globals the import section imports.
fn imported_globals(reader: &mut Reader) -> Result<u32, String> {
    let mut globals = 0;
    for _ in 0..reader.leb()? {
        reader.name()?;
        reader.name()?;
        match reader.byte()? {
            0 => drop(reader.leb()?),
            1 => {
                reader.value_type()?;
                reader.limits()?;
            }
            2 => reader.limits()?,
            3 => {
                reader.value_type()?;
                reader.byte()?;
                globals += 1;
            }
            4 => {
                reader.byte()?;
                reader.leb()?;
            }
            kind => return Err(format!("an import of unknown kind {kind}")),
        }
    }
    Ok(globals)
}

/// The indices (among the module's own) of its mutable globals.
fn mutable_globals(reader: &mut Reader) -> Result<Vec<u32>, String> {
    let mut mutable = Vec::new();
    for index in 0..reader.leb()? {
        reader.value_type()?;
        if reader.byte()? & 1 == 1 {
            mutable.push(index);
        }
        reader.const_expr()?;
    }
    Ok(mutable)
}

fn write_leb(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Just enough of the binary format to find globals and exports.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.at).ok_or("the module ends early")?;
        self.at += 1;
        Ok(byte)
    }

    fn skip(&mut self, n: usize) -> Result<(), String> {
        self.at = self.at.checked_add(n).filter(|&at| at <= self.bytes.len()).ok_or("the module ends early")?;
        Ok(())
    }

    /// An unsigned LEB128 of at most 32 bits.
    fn leb(&mut self) -> Result<u32, String> {
        let mut value = 0u64;
        for shift in (0..35).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return u32::try_from(value).map_err(|_| "a number too large".to_string());
            }
        }
        Err("a number too long".into())
    }

    /// Any LEB128 (signed or unsigned, up to 64 bits), skipped.
    fn any_leb(&mut self) -> Result<(), String> {
        for _ in 0..10 {
            if self.byte()? & 0x80 == 0 {
                return Ok(());
            }
        }
        Err("a number too long".into())
    }

    fn name(&mut self) -> Result<(), String> {
        let len = self.leb()? as usize;
        self.skip(len)
    }

    fn value_type(&mut self) -> Result<(), String> {
        match self.byte()? {
            0x7f | 0x7e | 0x7d | 0x7c | 0x7b | 0x70 | 0x6f => Ok(()),
            other => Err(format!("a value type this reader does not know (0x{other:02x})")),
        }
    }

    fn limits(&mut self) -> Result<(), String> {
        let flags = self.byte()?;
        self.any_leb()?;
        if flags & 1 == 1 {
            self.any_leb()?;
        }
        if flags & 8 == 8 {
            self.any_leb()?;
        }
        Ok(())
    }

    /// A constant expression, up to and with its `end`.
    fn const_expr(&mut self) -> Result<(), String> {
        loop {
            match self.byte()? {
                0x0b => return Ok(()),
                0x41 | 0x42 | 0x23 | 0xd2 => self.any_leb()?,
                0x43 => self.skip(4)?,
                0x44 => self.skip(8)?,
                0xd0 => drop(self.byte()?),
                0x6a | 0x6b | 0x6c | 0x7c | 0x7d | 0x7e => {}
                0xfd if self.leb()? == 12 => self.skip(16)?,
                other => return Err(format!("a constant instruction this reader does not know (0x{other:02x})")),
            }
        }
    }
}

/// The Ruby that runs a program: the program and its arguments travel as hex, so that no
/// byte of them is ever read as Ruby syntax of the prelude.
fn prelude(source: &str, args: &[String]) -> String {
    let args: Vec<String> = args.iter().map(|arg| format!("\"{}\"", hex::encode(arg))).collect();
    format!(
        r#"Encoding.default_external = Encoding::UTF_8
srand
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
exit!(Integer === status ? status & 0xff : 1)
"#,
        args = args.join(", "),
        source = hex::encode(source),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_mutable_global_is_exported_by_its_index_and_nothing_else_changes() {
        // An imported global (index 0), then an immutable one (1) with an init expression
        // holding a 0x0b byte, and a mutable one (2).
        let module = wat::parse_str(
            r#"(module (import "env" "g" (global i32)) (import "env" "f" (func))
                 (global i32 (i32.const 11)) (global (mut i64) (i64.const -5))
                 (memory (export "memory") 1))"#,
        )
        .unwrap();
        let exported = super::export_globals(&module).unwrap();
        let engine = wasmtime::Engine::default();
        let parsed = wasmtime::Module::new(&engine, &exported).unwrap();
        let names: Vec<&str> = parsed.exports().map(|export| export.name()).collect();
        assert_eq!(names, ["memory", "wirl-global-2"]);
        assert_eq!(parsed.imports().count(), 2);
        assert_eq!(super::export_globals(b"\0asm\x01\0\0\0").unwrap(), b"\0asm\x01\0\0\0", "nothing to export");
        assert!(super::export_globals(b"\0asm\x01\0\0\0\x07\x09\x01").is_err(), "a section past the end");
    }

    #[test]
    fn the_prelude_carries_program_and_arguments_as_hex_only() {
        let prelude = super::prelude("puts \"}]) ; exit!(3)", &["a\"b".into()]);
        assert!(!prelude.contains("exit!(3)"), "the program's bytes never appear as Ruby");
        assert!(prelude.contains(&hex::encode("a\"b")));
        assert!(prelude.contains(&hex::encode("puts \"}]) ; exit!(3)")));
    }
}
