use super::*;
use serde_json::json;

#[test]
fn both_shapes_read_and_every_bad_field_is_named() {
    let ours =
        json!({"apiVersion": API_VERSION, "kind": KIND, "activeThreadPercentage": 40, "pinnedMemoryLimit": "2Gi"});
    assert_eq!(
        parse(&ours),
        Ok(ShareConfig { active_thread_percentage: Some(40), pinned_memory_limit: Some(2 << 30) })
    );
    let nvidia = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS",
        "mpsConfig": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "1536Mi"}}});
    assert_eq!(
        parse(&nvidia),
        Ok(ShareConfig { active_thread_percentage: Some(30), pinned_memory_limit: Some(1536 << 20) })
    );
    let field = |v: Value| parse(&v).unwrap_err().field;
    assert_eq!(
        field(json!({"apiVersion": API_VERSION, "kind": KIND, "activeThreadPercentage": 0})),
        "activeThreadPercentage"
    );
    assert_eq!(
        field(json!({"apiVersion": API_VERSION, "kind": KIND, "activeThreadPercentage": 101})),
        "activeThreadPercentage"
    );
    assert_eq!(
        field(json!({"apiVersion": API_VERSION, "kind": KIND, "pinnedMemoryLimit": "lots"})),
        "pinnedMemoryLimit"
    );
    assert_eq!(field(json!({"apiVersion": API_VERSION, "kind": KIND, "thread": 5})), "thread");
    assert_eq!(field(json!({"apiVersion": "v9", "kind": "Other"})), "kind");
    assert_eq!(
        field(json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})),
        "sharing.strategy"
    );
    assert_eq!(
        field(json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS",
            "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}}})),
        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
    );
    assert_eq!(field(json!([1])), "parameters");
}
