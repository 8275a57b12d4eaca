//! Ranks on CUDA devices over NVIDIA's NCCL: the [`Comm`] of `wirl train --dp N --device
//! cuda` and `wirl generate --tp N --device cuda`. Built with the `cuda` feature only (candle's
//! `nccl` feature, cudarc's NCCL bindings; `libnccl.so.2` must be found at start, as the
//! CUDA libraries are).
//!
//! A group is made from one unique id that rank 0 draws ([`NcclComm::unique_id`]) and every
//! rank receives: ranks as threads share it in memory, ranks as processes under `mpirun`
//! receive it over MPI (`NcclComm::join` after an [`crate::all_gather_bytes`] of the id on
//! the MPI `Comm`). Every rank then joins at once (`ncclCommInitRank` blocks until all have).
//!
//! Sums are NCCL's own all-reduce: every rank receives the same bits (each element is reduced
//! once and then copied to all ranks), though not added in rank order as the CPU `Comm`s do,
//! so a CUDA group agrees with itself exactly and with one rank within float rounding.
//! Tensors on the host (the trainer's summed gradients are host buffers) cross to this
//! rank's device and back.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::cudarc::nccl::safe::{Comm as Nccl, Id, NcclType, ReduceOp};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{CudaStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use std::sync::Mutex;
use wirl_model::comm::Comm;
use wirl_model::{Error, Result};

/// The 128 bytes that name one NCCL group; rank 0 draws it, every rank joins with it.
pub type UniqueId = [u8; 128];

/// One rank of an NCCL group, bound to one CUDA device.
pub struct NcclComm {
    nccl: Mutex<NcclHandle>,
    device: CudaDevice,
    rank: usize,
    size: usize,
}

/// NCCL's communicator is a raw handle, so it is neither `Send` nor `Sync` by itself. NCCL
/// allows a communicator to be driven from any thread as long as its calls do not overlap;
/// the mutex around it makes them not overlap.
struct NcclHandle(Nccl);
// SAFETY: see above: every use goes through `NcclComm::nccl`'s mutex.
unsafe impl Send for NcclHandle {}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {} of {})", self.rank, self.size)
    }
}

fn nccl_error(what: &str, error: impl std::fmt::Debug) -> Error {
    Error::Comm(format!("NCCL {what}: {error:?}"))
}

impl NcclComm {
    /// A fresh group's id (rank 0 draws it; the others must receive these bytes).
    pub fn unique_id() -> Result<UniqueId> {
        let id = Id::new().map_err(|e| nccl_error("could not draw a unique id", e))?;
        Ok(id.internal().map(|c| c as u8))
    }

    /// Joins the group named by `id` as `rank` of `size`, on `device` (a CUDA device). Blocks
    /// until every rank has joined, so ranks as threads must each call it on their own thread.
    pub fn join(id: &UniqueId, rank: usize, size: usize, device: &Device) -> Result<NcclComm> {
        let Device::Cuda(device) = device else {
            return Err(Error::Comm(format!("NCCL ranks run on CUDA devices, not on {device:?}")));
        };
        if rank >= size {
            return Err(Error::Comm(format!("rank {rank} of a group of {size}")));
        }
        let stream = device.cuda_stream();
        stream.context().bind_to_thread().map_err(|e| nccl_error("could not bind the device", e))?;
        let id = Id::uninit(id.map(|b| b as core::ffi::c_char));
        let nccl = Nccl::from_rank(stream, rank, size, id)
            .map_err(|e| nccl_error(&format!("rank {rank} of {size} could not join its group"), e))?;
        Ok(NcclComm { nccl: Mutex::new(NcclHandle(nccl)), device: device.clone(), rank, size })
    }

    /// `x` on this rank's device (contiguous), with the device it came from.
    fn on_device(&self, x: &Tensor) -> Result<(Tensor, Device)> {
        let home = x.device().clone();
        let here = Device::Cuda(self.device.clone());
        let x = if home.same_device(&here) { x.contiguous()? } else { x.to_device(&here)?.contiguous()? };
        Ok((x, home))
    }

    fn collective(&self, x: &Tensor, kind: Collective) -> Result<Tensor> {
        let (x, home) = self.on_device(x)?;
        let out = x.apply_op1_no_bwd(&NcclOp { comm: self, kind })?;
        Ok(if home.same_device(out.device()) { out } else { out.to_device(&home)? })
    }
}

#[derive(Clone, Copy)]
enum Collective {
    Sum,
    Gather,
}

/// One collective as a candle op, so that it reads the tensor's device buffer in place.
struct NcclOp<'a> {
    comm: &'a NcclComm,
    kind: Collective,
}

impl NcclOp<'_> {
    fn run<T: CudaDType + DeviceRepr + NcclType>(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("NCCL collectives take contiguous tensors")
        };
        let input = storage.as_cuda_slice::<T>()?.slice(start..end);
        let device = &self.comm.device;
        // NCCL works on the calling thread's current CUDA context.
        device.cuda_stream().context().bind_to_thread().map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
        let nccl = self.comm.nccl.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (out_len, shape) = match self.kind {
            Collective::Sum => (input.len(), layout.shape().clone()),
            Collective::Gather => {
                let mut dims = vec![self.comm.size];
                dims.extend_from_slice(layout.dims());
                (input.len() * self.comm.size, Shape::from(dims))
            }
        };
        // SAFETY: every element is written by the collective before anything reads it.
        let mut out = unsafe { device.alloc::<T>(out_len)? };
        let done = match self.kind {
            Collective::Sum => nccl.0.all_reduce(&input, &mut out, &ReduceOp::Sum),
            Collective::Gather => nccl.0.all_gather(&input, &mut out),
        };
        done.map_err(|e| candle_core::Error::Msg(format!("NCCL collective failed on rank {}: {e:?}", self.comm.rank)))?;
        Ok((CudaStorage::wrap_cuda_slice(out, device.clone()), shape))
    }
}

impl CustomOp1 for NcclOp<'_> {
    fn name(&self) -> &'static str {
        match self.kind {
            Collective::Sum => "nccl-all-reduce",
            Collective::Gather => "nccl-all-gather",
        }
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("NCCL collectives run on CUDA tensors (NcclComm moves host tensors there first)")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        match storage.dtype() {
            DType::F32 => self.run::<f32>(storage, layout),
            DType::BF16 => self.run::<half::bf16>(storage, layout),
            DType::F16 => self.run::<half::f16>(storage, layout),
            DType::U8 => self.run::<u8>(storage, layout),
            DType::U32 => self.run::<u32>(storage, layout),
            DType::I64 => self.run::<i64>(storage, layout),
            DType::F64 => self.run::<f64>(storage, layout),
            other => candle_core::bail!("NCCL collectives of {other:?} tensors are not supported"),
        }
    }
}

impl Comm for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn device(&self) -> Option<Device> {
        Some(Device::Cuda(self.device.clone()))
    }

    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
        if self.size == 1 {
            return Ok(x.clone());
        }
        self.collective(x, Collective::Sum)
    }

    fn all_gather(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        if self.size == 1 {
            return Ok(x.clone());
        }
        // NCCL gathers whole buffers rank after rank: [size, ...x] — then along `dim`.
        let stacked = self.collective(x, Collective::Gather)?;
        if dim == 0 {
            let mut dims = x.dims().to_vec();
            dims[0] *= self.size;
            return Ok(stacked.reshape(dims)?);
        }
        let parts = (0..self.size).map(|rank| stacked.get(rank)).collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, dim)?)
    }
}
