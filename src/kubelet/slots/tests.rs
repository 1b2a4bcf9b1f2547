use super::*;
use proptest::prelude::*;

fn gpu(uuid: &str, replicas: u32, pct: Option<u32>, mib: Option<u64>) -> SlotGpu {
    SlotGpu {
        uuid: uuid.into(),
        settings: MpsSettings { replicas, active_thread_percentage: pct, pinned_memory_limit_mib: mib },
        pipe_dir: format!("/run/gpupart/mps/{uuid}/pipe"),
        shm_dir: format!("/run/gpupart/mps/{uuid}/shm"),
        healthy: true,
    }
}

#[test]
fn ids_round_trip_and_devices_carry_health() {
    assert_eq!(slot_id("GPU-a", 3), "GPU-a::3");
    assert_eq!(parse_slot_id("GPU-a::3"), Some(("GPU-a", 3)));
    assert_eq!(parse_slot_id("GPU-a"), None);
    let mut b = gpu("GPU-b", 2, None, None);
    b.healthy = false;
    let d = devices(&[gpu("GPU-a", 2, Some(50), Some(1024)), b]);
    let got: Vec<(&str, &str)> = d.iter().map(|d| (d.id.as_str(), d.health.as_str())).collect();
    assert_eq!(got, [("GPU-a::0", HEALTHY), ("GPU-a::1", HEALTHY), ("GPU-b::0", UNHEALTHY), ("GPU-b::1", UNHEALTHY)]);
}

#[test]
fn allocate_one_slot_and_two_slots() {
    let gpus = [gpu("GPU-a", 4, Some(25), Some(7168)), gpu("GPU-p", 4, None, None)];
    let r = allocate(&gpus, &["GPU-a::1".into()]).unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
    assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/run/gpupart/mps/GPU-a/pipe");
    assert_eq!(r.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=7168M");
    assert_eq!(r.mounts.len(), 2);
    assert_eq!(
        (r.mounts[1].container_path.as_str(), r.mounts[1].host_path.as_str()),
        ("/dev/shm", "/run/gpupart/mps/GPU-a/shm")
    );
    let two = allocate(&gpus, &["GPU-a::1".into(), "GPU-a::2".into()]).unwrap();
    assert_eq!(two.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
    assert_eq!(two.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=14336M");
    let pre_volta = allocate(&gpus, &["GPU-p::0".into()]).unwrap();
    assert!(!pre_volta.envs.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}

#[test]
fn allocate_refuses_clearly() {
    let gpus = [gpu("GPU-a", 4, Some(25), Some(1024)), gpu("GPU-b", 4, Some(25), Some(1024))];
    let e = allocate(&gpus, &["GPU-a::0".into(), "GPU-b::0".into()]).unwrap_err();
    assert!(e.contains("spans two GPUs (GPU-a and GPU-b)"), "{e}");
    assert!(allocate(&gpus, &["GPU-a::9".into()]).unwrap_err().contains("'GPU-a::9' is not served"));
    assert!(allocate(&gpus, &["nonsense".into()]).unwrap_err().contains("not an MPS slot id"));
    assert!(allocate(&gpus, &[]).is_err());
}

#[test]
fn preferred_packs_onto_the_busiest_gpu() {
    let gpus = [gpu("GPU-a", 4, None, None), gpu("GPU-b", 4, None, None)];
    // GPU-b has two slots in use (only 2 and 3 available), GPU-a none.
    let avail: Vec<String> =
        ["GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-a::3", "GPU-b::2", "GPU-b::3"].map(String::from).into();
    assert_eq!(preferred(&gpus, &avail, &[], 1), ["GPU-b::2"]);
    assert_eq!(preferred(&gpus, &avail, &[], 2), ["GPU-b::2", "GPU-b::3"]);
    // Three do not fit on GPU-b: the whole of GPU-a is used rather than spanning.
    assert_eq!(preferred(&gpus, &avail, &[], 3), ["GPU-a::0", "GPU-a::1", "GPU-a::2"]);
    assert_eq!(preferred(&gpus, &avail, &["GPU-a::3".into()], 2), ["GPU-a::3", "GPU-a::0"]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Against brute force: the answer is `size` available slots of one GPU, and no GPU with room
    /// for the request has more slots in use.
    #[test]
    fn preferred_is_one_gpu_and_the_busiest(
        replicas in proptest::collection::vec(2u32..8, 1..4),
        used_mask in proptest::collection::vec(any::<u8>(), 4),
        size in 1usize..5,
    ) {
        let gpus: Vec<SlotGpu> = replicas.iter().enumerate().map(|(i, r)| gpu(&format!("GPU-{i}"), *r, None, None)).collect();
        let mut avail = Vec::new();
        for (i, g) in gpus.iter().enumerate() {
            for n in 0..g.settings.replicas {
                if used_mask[i] & (1 << n) == 0 {
                    avail.push(slot_id(&g.uuid, n));
                }
            }
        }
        let free = |u: &str| avail.iter().filter(|id| parse_slot_id(id).unwrap().0 == u).count();
        let fits: Vec<&SlotGpu> = gpus.iter().filter(|g| free(&g.uuid) >= size).collect();
        let got = preferred(&gpus, &avail, &[], size);
        if fits.is_empty() {
            prop_assert!(got.is_empty());
        } else {
            prop_assert_eq!(got.len(), size);
            let on: Vec<&str> = got.iter().map(|id| parse_slot_id(id).unwrap().0).collect();
            prop_assert!(on.iter().all(|u| *u == on[0]));
            prop_assert!(got.iter().all(|id| avail.contains(id)));
            let used = |g: &SlotGpu| g.settings.replicas as usize - free(&g.uuid);
            let chosen = gpus.iter().find(|g| g.uuid == on[0]).unwrap();
            prop_assert!(fits.iter().all(|g| used(g) <= used(chosen)));
        }
    }
}
