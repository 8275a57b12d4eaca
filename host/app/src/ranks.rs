//! The ranks of one command (`wirl train --dp N`, `wirl generate --tp N`) and how they sum:
//! ranks on the CPU through `ThreadComm` (threads) or Open MPI (processes); ranks on CUDA
//! devices, one GPU each, through NCCL — its group's unique id shared in memory between
//! threads, or sent over MPI between processes.

use std::sync::Arc;
use wirl_engine::{Comm, ThreadComm};
use wirl_trainer::config::DeviceSpec;

/// `size` ranks as threads of this process on `device`. CUDA ranks take a GPU each, from
/// the one named on (`cuda:2` with three ranks: GPUs 2, 3 and 4): NCCL does not put two
/// ranks of one group on one GPU. With one rank, or on the CPU, the ranks name no device
/// (each loads on `device` itself).
pub fn threads(size: usize, device: DeviceSpec) -> anyhow::Result<Vec<Arc<dyn Comm>>> {
    match device {
        DeviceSpec::Cuda(base) if size > 1 => cuda_threads(size, base),
        _ => Ok(ThreadComm::group(size).into_iter().map(|comm| Arc::new(comm) as Arc<dyn Comm>).collect()),
    }
}

#[cfg(feature = "cuda")]
fn cuda_threads(size: usize, base: usize) -> anyhow::Result<Vec<Arc<dyn Comm>>> {
    use anyhow::Context;
    use wirl_engine::Device;
    // Every device opened before any rank joins: a rank that cannot start must fail here,
    // not leave the others waiting in NCCL's join.
    let mut devices = Vec::new();
    for rank in 0..size {
        let ordinal = base + rank;
        devices.push(
            Device::new_cuda(ordinal)
                .with_context(|| format!("rank {rank} of {size} needs GPU cuda:{ordinal} (one GPU per CUDA rank)"))?,
        );
    }
    let id = wirl_engine::NcclComm::unique_id()?;
    std::thread::scope(|scope| {
        let joining: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, device)| scope.spawn(move || wirl_engine::NcclComm::join(&id, rank, size, device)))
            .collect();
        joining
            .into_iter()
            .map(|rank| {
                let comm = rank.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                Ok(Arc::new(comm) as Arc<dyn Comm>)
            })
            .collect()
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_threads(_: usize, base: usize) -> anyhow::Result<Vec<Arc<dyn Comm>>> {
    anyhow::bail!("ranks on cuda:{base}: this wirl was built without CUDA; build one with scripts/build-cuda")
}

/// This process's rank of an `mpirun` job on `device`: on the CPU the MPI group itself; on
/// CUDA a rank of an NCCL group on GPU `cuda:B + local rank` (B: the device asked for; the
/// local rank: Open MPI's `OMPI_COMM_WORLD_LOCAL_RANK`, this process's place on its machine),
/// its unique id drawn by rank 0 and sent over MPI.
#[cfg(feature = "mpi")]
pub fn over_mpi(mpi: Arc<wirl_engine::MpiComm>, device: DeviceSpec) -> anyhow::Result<Arc<dyn Comm>> {
    match device {
        DeviceSpec::Cuda(base) if mpi.size() > 1 => mpi_cuda(mpi, base),
        _ => Ok(mpi),
    }
}

#[cfg(all(feature = "mpi", feature = "cuda"))]
fn mpi_cuda(mpi: Arc<wirl_engine::MpiComm>, base: usize) -> anyhow::Result<Arc<dyn Comm>> {
    use anyhow::Context;
    let (rank, size) = (mpi.rank(), mpi.size());
    let local: usize = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK").ok().and_then(|n| n.parse().ok()).unwrap_or(rank);
    let ordinal = base + local;
    let opened = wirl_engine::Device::new_cuda(ordinal)
        .with_context(|| format!("rank {rank} (local rank {local}) needs GPU cuda:{ordinal} (one GPU per CUDA rank)"));
    // Every rank says whether it has its GPU before any joins NCCL (a missing one must not
    // leave the others waiting in the join); rank 0's id travels with it.
    let mine = match (&opened, rank) {
        (Err(_), _) => Vec::new(),
        (Ok(_), 0) => wirl_engine::NcclComm::unique_id()?.to_vec(),
        (Ok(_), _) => vec![1],
    };
    let all = wirl_engine::all_gather_bytes(mpi.as_ref(), &mine)?;
    let device = opened?;
    if let Some(missing) = all.iter().position(|bytes| bytes.is_empty()) {
        anyhow::bail!("rank {missing} could not open its GPU");
    }
    let id: wirl_engine::comm_nccl::UniqueId =
        all[0].as_slice().try_into().map_err(|_| anyhow::anyhow!("rank 0 sent no NCCL id"))?;
    Ok(Arc::new(wirl_engine::NcclComm::join(&id, rank, size, &device)?))
}

#[cfg(all(feature = "mpi", not(feature = "cuda")))]
fn mpi_cuda(_: Arc<wirl_engine::MpiComm>, base: usize) -> anyhow::Result<Arc<dyn Comm>> {
    anyhow::bail!("ranks on cuda:{base}: this wirl was built without CUDA; build one with scripts/build-cuda")
}

/// Every rank's shard of the model at `path`, split over `tp` ranks as threads on `device`,
/// loaded side by side (rank 0's first).
pub fn load_shards(
    path: &std::path::Path,
    options: &wirl_engine::LoadOptions,
    tp: usize,
    device: DeviceSpec,
) -> anyhow::Result<Vec<wirl_engine::LoadedModel>> {
    let comms = threads(tp, device)?;
    std::thread::scope(|scope| {
        let loading: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let device = comm.device().unwrap_or_else(|| options.device.clone());
                let options = wirl_engine::LoadOptions { comm, device, ..options.clone() };
                scope.spawn(move || wirl_engine::load(path, &options))
            })
            .collect();
        // Joined in rank order; a rank's own error says more than the others'.
        let results: Vec<_> = loading
            .into_iter()
            .map(|rank| rank.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect();
        let mut shards = Vec::new();
        for (rank, result) in results.into_iter().enumerate() {
            shards.push(result.map_err(|e| anyhow::anyhow!("rank {rank} of {tp}: {e}"))?);
        }
        Ok(shards)
    })
}

/// Refused before any model is loaded: `ranks` data-parallel copies of the model at `path`
/// that cannot fit in this machine's memory (each rank holds the weights in f32 at least;
/// training needs several times that). `flag` names the setting.
pub fn check_copies_fit(path: &std::path::Path, ranks: usize, flag: &str) -> anyhow::Result<()> {
    if ranks <= 1 {
        return Ok(());
    }
    let config = wirl_engine::load::read_config(path)?;
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    let one = config.parameter_count().saturating_mul(4);
    let all = one.saturating_mul(ranks as u64);
    if let Some(available) = available_memory()
        && all > available
    {
        anyhow::bail!(
            "{flag} {ranks}: each rank loads its own copy of the model ({:.2} GiB of f32 weights at least), {:.1} GiB \
             for {ranks} ranks, but this machine has {:.1} GiB available; use fewer ranks",
            gib(one),
            gib(all),
            gib(available)
        );
    }
    Ok(())
}

/// Refused before any model is loaded: a tensor-parallel split that the model at `path`'s
/// heads or MLP width do not divide.
pub fn check_split(path: &std::path::Path, tp: usize, flag: &str) -> anyhow::Result<()> {
    if tp <= 1 {
        return Ok(());
    }
    let config = wirl_engine::load::read_config(path)?;
    for (field, value) in [
        ("num_attention_heads", config.num_attention_heads),
        ("num_key_value_heads", config.num_kv_heads()),
        ("intermediate_size", config.intermediate_size),
    ] {
        if !value.is_multiple_of(tp) {
            anyhow::bail!(
                "{flag} {tp}: the model's {field} ({value}) does not split over {tp} tensor-parallel ranks; use a \
                 number of ranks that divides it"
            );
        }
    }
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (None where there is no such file).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}
