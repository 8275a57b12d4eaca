//! Ranks as processes (and machines) over Open MPI: the [`Comm`] that `mpirun -n N wirl …`
//! gives each process. Built with the `mpi` feature only; `build.rs` links `libmpi`.
//!
//! The few calls needed are declared here against Open MPI's ABI (its handles are the
//! addresses of predefined globals: `MPI_COMM_WORLD` is `&ompi_mpi_comm_world`), so no
//! binding generator (and no libclang) is needed; MPICH, whose handles are integers, would
//! need its own declarations. Sums are not `MPI_Allreduce`: every rank gathers every rank's
//! values and adds them in rank order, so that all ranks hold bit-identical results (the
//! MPI standard does not promise that of a reduction, and ranks whose weights drift apart
//! by a rounding would no longer take the same optimizer step). That costs N× the bytes of
//! a ring reduction, which two to a few ranks afford; NCCL (GPUs) is the other `Comm`.

use candle_core::{DType, Device, Tensor};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};
use wirl_model::comm::Comm;
use wirl_model::{Error, Result};

#[allow(non_upper_case_globals)]
unsafe extern "C" {
    static ompi_mpi_comm_world: u8;
    static ompi_mpi_byte: u8;
    fn MPI_Init_thread(argc: *mut c_int, argv: *mut *mut *mut u8, required: c_int, provided: *mut c_int) -> c_int;
    fn MPI_Comm_rank(comm: *const c_void, rank: *mut c_int) -> c_int;
    fn MPI_Comm_size(comm: *const c_void, size: *mut c_int) -> c_int;
    fn MPI_Allgather(
        send: *const c_void,
        send_count: c_int,
        send_type: *const c_void,
        receive: *mut c_void,
        receive_count: c_int,
        receive_type: *const c_void,
        comm: *const c_void,
    ) -> c_int;
    fn MPI_Abort(comm: *const c_void, code: c_int) -> c_int;
    fn MPI_Finalize() -> c_int;
}

/// `MPI_THREAD_SERIALIZED`: collectives from any thread, one at a time (the `Mutex` below).
const THREAD_SERIALIZED: c_int = 2;
const SUCCESS: c_int = 0;

/// `MPI_COMM_WORLD`: the address of a global that libmpi defines (never read here).
fn world() -> *const c_void {
    std::ptr::addr_of!(ompi_mpi_comm_world).cast()
}

/// `MPI_BYTE`, likewise.
fn byte() -> *const c_void {
    std::ptr::addr_of!(ompi_mpi_byte).cast()
}

/// This process's rank of `MPI_COMM_WORLD`. One per process ([`MpiComm::world`]).
#[derive(Debug)]
pub struct MpiComm {
    rank: usize,
    size: usize,
    /// One collective at a time from this process.
    calls: Mutex<()>,
}

static WORLD: OnceLock<std::result::Result<(usize, usize), String>> = OnceLock::new();

impl MpiComm {
    /// Whether this process was started by Open MPI's `mpirun` (or `srun` with its PMIx).
    pub fn launched() -> bool {
        std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() || std::env::var_os("PMIX_RANK").is_some()
    }

    /// `MPI_COMM_WORLD`, initialising MPI on the first call.
    pub fn world() -> Result<MpiComm> {
        let world = WORLD.get_or_init(|| {
            let mut provided: c_int = 0;
            // SAFETY: MPI_Init_thread with null argc/argv is allowed; called once (OnceLock).
            let code = unsafe {
                MPI_Init_thread(std::ptr::null_mut(), std::ptr::null_mut(), THREAD_SERIALIZED, &mut provided)
            };
            if code != SUCCESS {
                return Err(format!("MPI_Init_thread failed (code {code})"));
            }
            if provided < THREAD_SERIALIZED {
                return Err(format!("this MPI provides thread level {provided}; wirl needs MPI_THREAD_SERIALIZED"));
            }
            let (mut rank, mut size): (c_int, c_int) = (0, 0);
            // SAFETY: MPI is initialised; the pointers are to live locals.
            let codes = unsafe { (MPI_Comm_rank(world(), &mut rank), MPI_Comm_size(world(), &mut size)) };
            if codes != (SUCCESS, SUCCESS) {
                return Err(format!("MPI_Comm_rank/size failed (codes {codes:?})"));
            }
            Ok((rank as usize, size as usize))
        });
        let &(rank, size) = world.as_ref().map_err(|e| Error::Comm(e.clone()))?;
        Ok(MpiComm { rank, size, calls: Mutex::new(()) })
    }

    /// End every rank of the job now (`MPI_Abort`): what a rank that fails calls, so that
    /// the others do not wait for it in their next collective.
    pub fn abort(code: i32) -> ! {
        // SAFETY: valid at any point after MPI_Init; it does not return on success.
        unsafe { MPI_Abort(world(), code) };
        std::process::exit(code)
    }

    /// Leave MPI at the end of a run that went well (every rank calls it once).
    pub fn finalize() {
        if matches!(WORLD.get(), Some(Ok(_))) {
            // SAFETY: MPI was initialised, and no collective is in progress at the run's end.
            unsafe { MPI_Finalize() };
        }
    }

    /// Every rank's `bytes` (all of one length), concatenated in rank order.
    fn gather(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let count = c_int::try_from(bytes.len())
            .map_err(|_| Error::Comm(format!("a message of {} bytes is more than one MPI call sends", bytes.len())))?;
        let mut all = vec![0u8; bytes.len() * self.size];
        let _serialized = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `bytes` holds `count` bytes and `all` `count × size`; MPI is initialised.
        let code = unsafe {
            MPI_Allgather(bytes.as_ptr().cast(), count, byte(), all.as_mut_ptr().cast(), count, byte(), world())
        };
        if code != SUCCESS {
            return Err(Error::Comm(format!("MPI_Allgather failed (code {code})")));
        }
        Ok(all)
    }

    /// Every rank's `x` (of one shape and dtype on every rank), in rank order.
    fn exchange(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let shape = x.shape().clone();
        let (dtype, device) = (x.dtype(), x.device().clone());
        let bytes = to_bytes(&x.to_device(&Device::Cpu)?)?;
        if bytes.is_empty() {
            return Ok(vec![x.clone(); self.size]);
        }
        let all = self.gather(&bytes)?;
        all.chunks(bytes.len()).map(|chunk| Ok(from_bytes(chunk, dtype, &shape)?.to_device(&device)?)).collect()
    }
}

/// A CPU tensor's values as bytes (native order: every rank of a job shares the machine's
/// architecture).
fn to_bytes(x: &Tensor) -> Result<Vec<u8>> {
    let x = x.flatten_all()?;
    Ok(match x.dtype() {
        DType::F32 => x.to_vec1::<f32>()?.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::U32 => x.to_vec1::<u32>()?.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::U8 => x.to_vec1::<u8>()?,
        other => return Err(Error::Comm(format!("collectives of {other:?} tensors are not supported"))),
    })
}

fn from_bytes(bytes: &[u8], dtype: DType, shape: &candle_core::Shape) -> Result<Tensor> {
    let device = Device::Cpu;
    let tensor = match dtype {
        DType::F32 => {
            let values: Vec<f32> =
                bytes.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect();
            Tensor::from_vec(values, shape, &device)?
        }
        DType::U32 => {
            let values: Vec<u32> =
                bytes.chunks_exact(4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect();
            Tensor::from_vec(values, shape, &device)?
        }
        DType::U8 => Tensor::from_vec(bytes.to_vec(), shape, &device)?,
        other => return Err(Error::Comm(format!("collectives of {other:?} tensors are not supported"))),
    };
    Ok(tensor)
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
        wirl_model::comm::sum_in_rank_order(self.exchange(x)?)
    }

    fn all_gather(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        Ok(Tensor::cat(&self.exchange(x)?, dim)?)
    }

    fn all_reduce_sum_in_place(&self, values: &mut [f32]) -> Result<()> {
        // The values' own bytes out, every rank's gathered, summed straight back into them:
        // one gather and one pass, where the tensor path copied the bucket five more times.
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        if bytes.is_empty() {
            return Ok(());
        }
        let all = self.gather(&bytes)?;
        let ranks: Vec<&[u8]> = all.chunks(bytes.len()).collect();
        for (i, value) in values.iter_mut().enumerate() {
            let at = |rank: &[u8]| f32::from_ne_bytes([rank[4 * i], rank[4 * i + 1], rank[4 * i + 2], rank[4 * i + 3]]);
            // In rank order, as `sum_in_rank_order` adds (so both paths give the same bits).
            let mut sum = at(ranks[0]);
            for rank in &ranks[1..] {
                sum += at(rank);
            }
            *value = sum;
        }
        Ok(())
    }
}
