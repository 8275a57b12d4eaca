//! The two steps of a C guest's build that need the component-model crates:
//!
//!   componentize-c bindings WIT_DIR WORLD OUT_DIR   # WORLD.h, WORLD.c, WORLD_component_type.o
//!   componentize-c component CORE.wasm OUT.wasm     # a wasm32-wasi reactor module -> component

use anyhow::{Context, bail};
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["bindings", wit, world, out] => bindings(Path::new(wit), world, Path::new(out)),
        ["component", core, out] => component(Path::new(core), Path::new(out)),
        _ => {
            bail!("usage: componentize-c bindings WIT_DIR WORLD OUT_DIR | componentize-c component CORE.wasm OUT.wasm")
        }
    }
}

fn bindings(wit: &Path, world: &str, out: &Path) -> anyhow::Result<()> {
    let mut resolve = wit_bindgen_core::wit_parser::Resolve::default();
    let (package, _) =
        resolve.push_path(wit).with_context(|| format!("reading the WIT package in {}", wit.display()))?;
    let world = resolve.select_world(&[package], Some(world))?;
    let mut files = wit_bindgen_core::Files::default();
    wit_bindgen_c::Opts::default().build().generate(&mut resolve, world, &mut files)?;
    std::fs::create_dir_all(out)?;
    for (name, contents) in files.iter() {
        std::fs::write(out.join(name), contents).with_context(|| format!("writing {name} in {}", out.display()))?;
    }
    Ok(())
}

fn component(core: &Path, out: &Path) -> anyhow::Result<()> {
    let module = std::fs::read(core).with_context(|| format!("reading {}", core.display()))?;
    let bytes = wit_component::ComponentEncoder::default()
        .module(&module)?
        .adapter(
            "wasi_snapshot_preview1",
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?
        .validate(true)
        .encode()
        .with_context(|| format!("making a component of {}", core.display()))?;
    std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))
}
