//! Opaque NVML handles. A handle is a tagged integer cast to a pointer, never dereferenced:
//! tag (bits 56–63), GPU index (bits 32–47), GI id (bits 16–31), CI id (bits 0–15).

const TAG_DEVICE: u64 = 0xD1;
const TAG_GPU_INSTANCE: u64 = 0xD2;
const TAG_COMPUTE_INSTANCE: u64 = 0xD3;
const TAG_MIG_DEVICE: u64 = 0xD4;

/// What a handle refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    /// A physical GPU.
    Device(u32),
    /// A GPU instance: (GPU, GI id).
    GpuInstance(u32, u32),
    /// A compute instance: (GPU, GI id, CI id).
    ComputeInstance(u32, u32, u32),
    /// A MIG device (the device view of a compute instance): (GPU, GI id, CI id).
    MigDevice(u32, u32, u32),
}

impl Handle {
    /// The pointer value handed to callers.
    pub fn encode<T>(self) -> *mut T {
        let (tag, gpu, gi, ci) = match self {
            Handle::Device(g) => (TAG_DEVICE, g, 0, 0),
            Handle::GpuInstance(g, gi) => (TAG_GPU_INSTANCE, g, gi, 0),
            Handle::ComputeInstance(g, gi, ci) => (TAG_COMPUTE_INSTANCE, g, gi, ci),
            Handle::MigDevice(g, gi, ci) => (TAG_MIG_DEVICE, g, gi, ci),
        };
        let v = (tag << 56) | (u64::from(gpu & 0xFFFF) << 32) | (u64::from(gi & 0xFFFF) << 16) | u64::from(ci & 0xFFFF);
        v as usize as *mut T
    }

    /// Decodes a pointer received from a caller; `None` for anything this library did not make.
    pub fn decode<T>(p: *mut T) -> Option<Self> {
        let v = p as usize as u64;
        let gpu = ((v >> 32) & 0xFFFF) as u32;
        let gi = ((v >> 16) & 0xFFFF) as u32;
        let ci = (v & 0xFFFF) as u32;
        match v >> 56 {
            TAG_DEVICE => Some(Handle::Device(gpu)),
            TAG_GPU_INSTANCE => Some(Handle::GpuInstance(gpu, gi)),
            TAG_COMPUTE_INSTANCE => Some(Handle::ComputeInstance(gpu, gi, ci)),
            TAG_MIG_DEVICE => Some(Handle::MigDevice(gpu, gi, ci)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for h in [
            Handle::Device(7),
            Handle::GpuInstance(3, 14),
            Handle::ComputeInstance(1, 2, 3),
            Handle::MigDevice(0, 9, 0),
        ] {
            assert_eq!(Handle::decode(h.encode::<u8>()), Some(h));
        }
        assert_eq!(Handle::decode(std::ptr::null_mut::<u8>()), None);
        assert_eq!(Handle::decode(0x1234usize as *mut u8), None);
    }
}
