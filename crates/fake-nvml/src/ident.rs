//! How NVIDIA's tools name a GPU, and which simulated GPU a name denotes: NVML index, `GPU-…`
//! UUID, board serial, or PCI bus id in any of the forms NVML and `nvidia-smi -i` accept
//! (`00000000:07:00.0`, `0000:07:00.0`, `07:00.0`, `07:00`, any case).

use gpupart_mig::sim::SimGpu;

/// (domain, bus, device, function) of a PCI bus id string.
pub fn bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let hex = |p: &str| (!p.is_empty() && p.len() <= 8).then(|| u32::from_str_radix(p, 16).ok()).flatten();
    let (rest, function) = match s.trim().rsplit_once('.') {
        Some((r, f)) => (r, hex(f)?),
        None => (s.trim(), 0),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, device) = match parts.as_slice() {
        [d, b, dev] => (hex(d)?, hex(b)?, hex(dev)?),
        [b, dev] => (0, hex(b)?, hex(dev)?),
        _ => return None,
    };
    Some((domain, bus, device, function))
}

/// The board serial the fake reports for a GPU: 13 decimal digits derived from its UUID.
pub fn serial(gpu: &SimGpu) -> String {
    let hex: String = gpu.uuid.chars().filter(char::is_ascii_hexdigit).skip(3).take(8).collect();
    format!("{:013}", u64::from_str_radix(&hex, 16).unwrap_or(u64::from(gpu.index)) + 1_320_000_000_000)
}

/// The board part number the fake reports (synthetic, from the PCI device id).
pub fn board_part_number(pci_device_id: u32) -> String {
    format!("699-{:04X}-0000-FAK", pci_device_id >> 16)
}

/// Whether `target` names `gpu` (index, UUID, serial or bus id).
pub fn names(gpu: &SimGpu, target: &str) -> bool {
    let t = target.trim();
    t == gpu.index.to_string()
        || t.eq_ignore_ascii_case(&gpu.uuid)
        || t == serial(gpu)
        || matches!((bus_id(t), bus_id(&gpu.bus_id)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_forms() {
        let full = bus_id("00000000:07:00.0").unwrap();
        for s in ["0000:07:00.0", "07:00.0", "07:00", "00000000:07:00.0 ", "0000:07:00"] {
            assert_eq!(bus_id(s), Some(full), "{s}");
        }
        assert_eq!(bus_id("0000:0F:00.0"), bus_id("0000:0f:00.0"));
        for bad in ["", "7", "xx:00.0", "0000:07:00.0.1", "0000:07:00.z"] {
            assert_eq!(bus_id(bad), None, "{bad}");
        }
    }
}
