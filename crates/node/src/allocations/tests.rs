use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::GpuBackend;

fn node() -> Vec<GpuState> {
    let b = SimBackend::open(Some("A100-SXM4-80GB:1,V100-SXM2-16GB:1"), None).unwrap();
    b.set_mig_mode(0, true).unwrap();
    b.reset_gpu(0).unwrap();
    let table = b.observe(0).unwrap().profiles;
    let p = table.resolve(&"3g.40gb".parse().unwrap()).unwrap().0.clone();
    for start in [0, 4] {
        let gi = b.create_gpu_instance(0, p.id, crate::mig::Placement::new(start, 4)).unwrap();
        b.create_compute_instance(0, gi, 2, crate::mig::Placement::new(0, 3)).unwrap();
    }
    b.observe_all().unwrap()
}

fn use_of(id: &str, resource: &str) -> PodUse {
    PodUse {
        namespace: "ns".into(),
        pod: "p".into(),
        container: "c".into(),
        resource: resource.into(),
        device_id: id.into(),
    }
}

#[test]
fn ids_map_to_mig_devices_whole_gpus_and_replicas() {
    let mut states = node();
    let mig = states[0].instances[1].cis[0].uuid.clone();
    let (gi, ci) = (states[0].instances[0].id, states[0].instances[0].cis[0].id);
    let gpu0 = states[0].info.uuid.clone();
    let gpu1 = states[1].info.uuid.clone();
    let uses = [
        use_of(&mig, "nvidia.com/mig-3g.40gb"),
        use_of(&format!("MIG-{gpu0}/{gi}/{ci}"), "nvidia.com/mig-3g.40gb"),
        use_of(&gpu1, "nvidia.com/gpu"),
        use_of(&format!("{gpu1}::3"), "gpupart.io/mps"),
        use_of("MIG-unknown", "nvidia.com/mig-1g.10gb"),
        use_of("0000:3b:00.0", "example.com/nic"),
    ];
    let unknown = attach(&mut states, &uses);
    assert_eq!(unknown.len(), 2);
    assert_eq!(states[0].instances[1].cis[0].pods.len(), 1);
    assert_eq!(states[0].instances[0].cis[0].pods.len(), 1, "old MIG-<gpu>/<gi>/<ci> form");
    assert!(states[0].instances.iter().all(|g| g.busy()));
    assert_eq!(states[1].pods.len(), 2);
    let mut again = node();
    attach(&mut again, &[use_of(&format!("{gpu0}:{gi}:{ci}"), "nvidia.com/mig-3g.40gb")]);
    assert!(again[0].instances[0].busy() && !again[0].instances[1].busy(), "old <gpu>:<gi>:<ci> form");
}
