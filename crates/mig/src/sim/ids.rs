//! Deterministic UUIDs and bus ids for simulated devices.

/// SplitMix64 step, used as a small deterministic hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash_str(s: &str, seed: u64) -> u64 {
    s.bytes().fold(mix(seed), |h, b| mix(h ^ u64::from(b)))
}

/// Formats 128 bits as an RFC 4122 version-5 style UUID body.
fn uuid_body(hi: u64, lo: u64) -> String {
    let hi = (hi & !0xF000) | 0x5000;
    let lo = (lo & !(0xC000 << 48)) | (0x8000 << 48);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// `GPU-…` UUID of simulated GPU `index` of model `model`.
pub fn gpu_uuid(model: &str, index: u32) -> String {
    let h = hash_str(model, u64::from(index));
    format!("GPU-{}", uuid_body(h, mix(h)))
}

/// `MIG-…` UUID of a new MIG device on GPU `gpu_uuid`, unique per `serial`.
pub fn mig_uuid(gpu_uuid: &str, serial: u64) -> String {
    let h = hash_str(gpu_uuid, serial);
    format!("MIG-{}", uuid_body(h, mix(h ^ serial)))
}

/// PCI bus id of simulated GPU `index` (DGX-like bus numbers for the first eight).
pub fn bus_id(index: u32) -> String {
    const BUSES: [u32; 8] = [0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD];
    let bus = BUSES.get(index as usize).copied().unwrap_or(0xC0 + index);
    format!("00000000:{bus:02X}:00.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_well_formed_and_distinct() {
        let a = gpu_uuid("A100-SXM4-80GB", 0);
        assert_eq!(a.len(), 40);
        assert_ne!(a, gpu_uuid("A100-SXM4-80GB", 1));
        let m = mig_uuid(&a, 1);
        assert!(m.starts_with("MIG-") && m.len() == 40);
        assert_eq!(&m[18..19], "5");
        assert_ne!(m, mig_uuid(&a, 2));
        assert_eq!(bus_id(0), "00000000:07:00.0");
    }
}
