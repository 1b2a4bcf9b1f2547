//! The DRA test rig: the API test server with this node, the fake DRA kubelet, the real binary
//! as `gpupart agent --dra` on the fake NVML, and the scheduler stand-in that allocates claims
//! from the published ResourceSlices (tests/support/allocator.rs) and writes their status.
#![allow(dead_code)]

use super::allocator::{Allocated, Allocator, Request};
use super::apiserver::ApiServer;
use super::dra_kubelet::DraKubelet;
use super::kube_agent::Agent;
use super::{Backend, Node};
use gpupart::dra::slices::SliceSpec;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

pub const NODE: &str = "gpu-node-1";
pub const DRIVER: &str = "gpu.gpupart.io";

/// Everything one DRA test needs.
pub struct DraRig {
    pub node: Node,
    pub api: ApiServer,
    pub kubelet: DraKubelet,
    pub agent: std::sync::Mutex<Option<Agent>>,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// The plugin's `--metrics-addr` port (`/healthz`, `/readyz`, `/metrics`).
    pub port: u16,
}

/// Another tool's MIG device on GPU 0, made before the plugin started: a 1g.10gb at slice 6.
pub fn foreign_instance(s: &mut gpupart::mig::sim::SimState) {
    s.gpus[0].gpu_instances.push(gpupart::mig::sim::SimGi {
        id: 9,
        profile_id: 19,
        placement: gpupart::mig::Placement::new(6, 1),
        processes: Vec::new(),
        compute_instances: vec![gpupart::mig::sim::SimCi {
            id: 0,
            profile_id: 0,
            placement: gpupart::mig::Placement::new(0, 1),
            uuid: "MIG-00000000-0000-4000-8000-00000000f00d".into(),
            processes: Vec::new(),
        }],
    });
}

/// Applies the DeviceClasses as shipped (deploy/dra/deviceclasses.yaml), as `kubectl apply` does.
pub fn put_classes(api: &ApiServer) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/dra/deviceclasses.yaml");
    for class in serde_saphyr::from_multiple::<Value>(&std::fs::read_to_string(path).unwrap()).unwrap() {
        api.put("deviceclasses", class);
    }
}

impl DraRig {
    /// A node of `spec` GPUs (MIG mode on for MIG-capable ones), the DeviceClasses, and the
    /// plugin running.
    pub fn start(spec: &str) -> Self {
        Self::start_with(spec, &[], &[])
    }

    /// As [`DraRig::start`], with extra agent arguments and environment.
    pub fn start_with(spec: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_after(spec, extra, env, |_| {})
    }

    /// As [`DraRig::start_with`], changing the simulated GPUs with `edit` before the plugin starts.
    pub fn start_after(
        spec: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        edit: impl FnOnce(&mut gpupart::mig::sim::SimState),
    ) -> Self {
        Self::start_on(Backend::Nvml, spec, extra, env, edit)
    }

    /// As [`DraRig::start_after`], on `backend` (the fake libnvidia-ml, or the built-in
    /// simulator, which has no NVIDIA driver).
    pub fn start_on(
        backend: Backend,
        spec: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        edit: impl FnOnce(&mut gpupart::mig::sim::SimState),
    ) -> Self {
        let node = Node::with(backend, spec);
        let mut s = node.load();
        for g in &mut s.gpus {
            if g.catalog_model().is_some_and(|m| m.mig_capable()) {
                g.mig_mode.current = true;
                g.mig_mode.pending = true;
            }
        }
        edit(&mut s);
        node.save(&s);
        let mut minors = String::from("config 1\nmonitor 2\n");
        for g in 0..s.gpus.len() {
            for gi in 0..16 {
                minors.push_str(&format!("gpu{g}/gi{gi}/access {}\n", 1000 + 100 * g + 2 * gi));
                minors.push_str(&format!("gpu{g}/gi{gi}/ci0/access {}\n", 1000 + 100 * g + 2 * gi + 1));
            }
        }
        std::fs::write(node.dir.path().join("mig-minors"), minors).unwrap();
        let api = ApiServer::start(NODE);
        put_classes(&api);
        let kubelet = DraKubelet::start(&node.dir.path().join("plugins_registry"));
        let rig = Self {
            node,
            api,
            kubelet,
            agent: std::sync::Mutex::new(None),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            port: super::baremetal::free_port(),
        };
        rig.launch();
        rig
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.node.dir.path().join(p)
    }

    /// A rig whose own plugin published its pool, was stopped, and whose slices were removed with
    /// what the killed plugin left in the kubelet's directories (as a kubelet restart would):
    /// for tests that start a plugin of their own.
    pub fn stopped(spec: &str, env: &[(&str, &str)], edit: impl FnOnce(&mut gpupart::mig::sim::SimState)) -> Self {
        let rig = Self::start_after(spec, &[], env, edit);
        rig.wait_slices("the pool", |s| !s.is_empty());
        rig.kill();
        rig.api.change(|s| s.objects.retain(|k, _| k.0 != "resourceslices"));
        std::fs::remove_dir_all(rig.path(&format!("plugins/{DRIVER}"))).unwrap();
        std::fs::remove_file(rig.path(&format!("plugins_registry/{DRIVER}-reg.sock"))).unwrap();
        rig
    }

    /// Kills the plugin (SIGKILL, wherever it is).
    pub fn kill(&self) {
        *self.agent.lock().unwrap() = None;
    }

    /// The plugin's command line as the rig runs it, with `set`'s flags given these values
    /// instead (a flag the rig does not give is added).
    fn command(&self, set: &[(&str, &str)]) -> std::process::Command {
        let kubeconfig = self.api.kubeconfig(self.node.dir.path());
        let paths =
            ["plugins_registry", "plugins", "cdi", "mig-minors", "dra-state", "agent.lock"].map(|p| self.path(p));
        let s = |p: &PathBuf| p.to_str().unwrap().to_string();
        let mut flags: Vec<(String, String)> = [
            ("--node-name", NODE.to_string()),
            ("--kubelet-registry-dir", s(&paths[0])),
            ("--kubelet-plugins-dir", s(&paths[1])),
            ("--cdi-dir", s(&paths[2])),
            ("--nvidia-caps-minors", s(&paths[3])),
            ("--dra-state-dir", s(&paths[4])),
            ("--lock-file", s(&paths[5])),
            ("--metrics-addr", format!("127.0.0.1:{}", self.port)),
        ]
        .into_iter()
        .map(|(f, v)| (f.to_string(), v))
        .collect();
        for (f, v) in set {
            match flags.iter_mut().find(|(g, _)| g == f) {
                Some(x) => x.1 = v.to_string(),
                None => flags.push((f.to_string(), v.to_string())),
            }
        }
        let mut args: Vec<String> = vec!["agent".into(), "--dra".into()];
        args.extend(flags.into_iter().flat_map(|(f, v)| [f, v]));
        args.extend(self.extra.iter().cloned());
        let mut env: Vec<(String, String)> = self.env.clone();
        env.push(("KUBECONFIG".into(), s(&kubeconfig)));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let envv: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.node.command(&argv, &envv)
    }

    /// Starts (or restarts) the plugin.
    pub fn launch(&self) {
        self.kill();
        // The agent's log: where GPUPART_TEST_AGENT_LOG says, else the rig's own file
        // ([`DraRig::stderr`]).
        let at = std::env::var_os("GPUPART_TEST_AGENT_LOG").map_or_else(|| self.path("agent.log"), PathBuf::from);
        let log = std::fs::File::create(at).ok();
        let stderr = log.map_or_else(Stdio::null, Stdio::from);
        let child = self.command(&[]).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
        *self.agent.lock().unwrap() = Some(Agent(child));
    }

    /// Runs another plugin beside the rig's with `set`'s flags changed, waiting up to `secs` for it
    /// to exit: its exit code (`None`: still running, then killed) and what it logged.
    pub fn try_start(&self, set: &[(&str, &str)], secs: u64) -> (Option<i32>, String) {
        let log = self.path(&format!("try-{}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = self.command(set).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let code = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code();
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        (code, std::fs::read_to_string(&log).unwrap_or_default())
    }

    /// An HTTP GET of the plugin's metrics port (`/readyz`): the raw response.
    pub fn get(&self, path: &str) -> String {
        super::http_get(self.port, path)
    }

    /// What the agent logged so far (empty when GPUPART_TEST_AGENT_LOG sends it elsewhere).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("agent.log")).unwrap_or_default()
    }

    /// Every ResourceSlice of the node: (name, spec), sorted by name.
    pub fn slices(&self) -> Vec<(String, SliceSpec)> {
        let mut out: Vec<(String, SliceSpec)> = self
            .api
            .store()
            .all("resourceslices")
            .into_iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    serde_json::from_value(o["spec"].clone()).expect("a ResourceSlice spec"),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The published device names, in the order the scheduler visits them.
    pub fn device_order(&self) -> Vec<String> {
        self.slices().iter().flat_map(|(_, s)| s.devices.iter().map(|d| d.name.clone())).collect()
    }

    /// Waits until the published pool is complete (every slice of one generation there) and
    /// satisfies `ok`.
    pub fn wait_slices(&self, what: &str, ok: impl Fn(&[(String, SliceSpec)]) -> bool) -> Vec<(String, SliceSpec)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.slices();
            let complete = s.first().is_some_and(|(_, f)| {
                s.iter().all(|(_, x)| {
                    x.pool.generation == f.pool.generation && x.pool.resource_slice_count == s.len() as i64
                })
            });
            if complete && ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                s.iter().map(|x| &x.0).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every device of this node's pool allocated to a claim.
    pub fn allocated(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.api.store().all("resourceclaims") {
            for r in c["status"]["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default() {
                if r["driver"] == DRIVER && r["pool"] == NODE {
                    out.push(r["device"].as_str().unwrap_or_default().to_string());
                }
            }
        }
        out
    }

    /// Judges devices against the allocated ones (by name): whether each could be created given
    /// them alone and is not tainted, i.e. what the plugin should list first in its slice.
    fn judge(&self, allocated: &[String]) -> impl Fn(&gpupart::dra::slices::Device) -> bool {
        use gpupart::dra::devices::{DeviceKind, DeviceRef};
        let tables = tables_of(&self.node.load());
        let taken: Vec<DeviceRef> = allocated.iter().filter_map(|a| DeviceRef::parse(a, |g| tables.get(&g))).collect();
        move |d| {
            let Some(me) = DeviceRef::parse(&d.name, |g| tables.get(&g)) else { return false };
            let mut mine = taken.iter().filter(|a| a.gpu == me.gpu);
            d.taints.is_empty()
                && match me.kind {
                    DeviceKind::Gpu => mine.next().is_none(),
                    DeviceKind::Mps => mine.all(|a| a.kind == DeviceKind::Mps),
                    DeviceKind::Mig { placement, .. } => mine.all(|a| match a.kind {
                        DeviceKind::Gpu | DeviceKind::Mps => false,
                        DeviceKind::Mig { placement: p, .. } => !p.overlaps(placement),
                    }),
                }
        }
    }

    /// The listed devices that can be created given the allocations and are not tainted, in
    /// visiting order: what the scheduler could hand out next, in the order it would.
    pub fn offered(&self) -> Vec<String> {
        let creatable = self.judge(&self.allocated());
        self.slices()
            .iter()
            .flat_map(|(_, s)| s.devices.iter().filter(|d| creatable(d)).map(|d| d.name.clone()))
            .collect()
    }

    /// The publication order the plugin should show now, as a sort key per device name: the GPUs
    /// as the simulator holds them (every instance, processes outside MIG) plus every allocated
    /// device occupying its placement, ranked by the node library's order; the rest after it,
    /// in device order.
    fn expected_rank(&self) -> impl Fn(&str) -> (usize, Option<gpupart::dra::devices::DeviceRef>) {
        use gpupart::dra::devices::{DeviceKind, DeviceRef};
        use gpupart::dra::order::{order, GpuView};
        let state = self.node.load();
        let tables = tables_of(&state);
        let allocated: Vec<DeviceRef> =
            self.allocated().iter().filter_map(|a| DeviceRef::parse(a, |g| tables.get(&g))).collect();
        let views: Vec<GpuView> = state
            .gpus
            .iter()
            .map(|g| {
                let mut occupied: Vec<(u32, gpupart::mig::Placement)> =
                    g.gpu_instances.iter().map(|gi| (gi.profile_id, gi.placement)).collect();
                for a in allocated.iter().filter(|a| a.gpu == g.index) {
                    if let DeviceKind::Mig { profile_id, placement } = a.kind {
                        if !occupied.iter().any(|(_, p)| *p == placement) {
                            occupied.push((profile_id, placement));
                        }
                    }
                }
                let whole = allocated.iter().any(|a| a.gpu == g.index && a.kind == DeviceKind::Gpu);
                let table = tables.get(&g.index).cloned().unwrap_or_else(gpupart::mig::ProfileTable::empty);
                let shares = allocated.iter().filter(|a| a.gpu == g.index && a.kind == DeviceKind::Mps).count() as u32;
                GpuView {
                    index: g.index,
                    mps_device: table.profiles.is_empty(),
                    table,
                    mig_enabled: g.mig_mode.current,
                    occupied,
                    whole_taken: whole || (!g.mig_mode.current && !g.processes.is_empty() && shares == 0),
                    mps_shares: shares,
                }
            })
            .collect();
        let rank: std::collections::BTreeMap<DeviceRef, usize> =
            order(&views).into_iter().enumerate().map(|(i, d)| (d, i)).collect();
        move |name| {
            let d = DeviceRef::parse(name, |g| tables.get(&g));
            (d.and_then(|d| rank.get(&d).copied()).unwrap_or(usize::MAX), d)
        }
    }

    /// Waits (up to 3 s) until the publication reflects every allocation: each slice lists the
    /// devices that can be created now in the order the node's GPUs and allocations call for
    /// (the others may sit anywhere among them: the scheduler skips them).
    pub fn wait_caught_up(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let rank = self.expected_rank();
            let slices = self.slices();
            let ordered = slices.iter().all(|(_, s)| {
                let keys: Vec<usize> = s.devices.iter().map(|d| rank(&d.name).0).filter(|r| *r != usize::MAX).collect();
                keys.windows(2).all(|w| w[0] < w[1])
            });
            if ordered {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Creates a claim of `requests`: (request name, device class, CEL selector or "", count).
    pub fn claim(&self, name: &str, requests: &[(&str, &str, &str, u32)]) -> String {
        let reqs: Vec<Value> = requests
            .iter()
            .map(|(n, class, cel, count)| {
                let mut exactly = json!({"deviceClassName": class, "allocationMode": "ExactCount", "count": count});
                if !cel.is_empty() {
                    exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
                }
                json!({"name": n, "exactly": exactly})
            })
            .collect();
        let uid = format!("uid-{name}");
        self.api.put(
            "resourceclaims",
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml", "uid": uid}, "spec": {"devices": {"requests": reqs}}}),
        );
        uid
    }

    /// A claim for one MPS share (class `mps.gpupart.io`) asking for `memory` (a quantity; "" asks
    /// for none).
    pub fn mps_claim(&self, name: &str, memory: &str) -> String {
        let uid = self.claim(name, &[("gpu", "mps.gpupart.io", "", 1)]);
        if !memory.is_empty() {
            let key = ("resourceclaims".to_string(), "ml".to_string(), name.to_string());
            self.api.change(|s| {
                let mut c = s.objects.get(&key).cloned().expect("the claim exists");
                c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = json!({"requests": {"memory": memory}});
                s.put(key.clone(), c);
            });
        }
        uid
    }

    /// Gives claim `name` an opaque config for this driver (`spec.devices.config`).
    pub fn configure(&self, name: &str, parameters: Value) {
        let key = ("resourceclaims".to_string(), "ml".to_string(), name.to_string());
        self.api.change(|s| {
            let mut c = s.objects.get(&key).cloned().expect("the claim exists");
            c["spec"]["devices"]["config"] = json!([{"opaque": {"driver": DRIVER, "parameters": parameters}}]);
            s.put(key.clone(), c);
        });
    }

    /// A claim for one MIG device of `profile`.
    pub fn mig_claim(&self, name: &str, profile: &str) -> String {
        let cel = format!("device.attributes['{DRIVER}'].profile == '{profile}'");
        self.claim(name, &[("gpu", "mig.gpupart.io", &cel, 1)])
    }

    /// The scheduler stand-in: allocates claim `name` from the published slices as kube-scheduler
    /// would, and writes its `status.allocation`; `Err` says why it cannot be allocated.
    pub fn schedule(&self, name: &str) -> Result<Vec<Allocated>, String> {
        self.wait_caught_up();
        let claim = self.api.get("resourceclaims", "ml", name).ok_or("no such claim")?;
        let mut requests = Vec::new();
        for r in claim["spec"]["devices"]["requests"].as_array().cloned().unwrap_or_default() {
            let ex = &r["exactly"];
            let class = ex["deviceClassName"].as_str().unwrap_or_default();
            let class_obj = self.api.get("deviceclasses", "", class).ok_or(format!("no DeviceClass {class}"))?;
            let mut req =
                Request::new(r["name"].as_str().unwrap_or_default(), &[], ex["count"].as_u64().unwrap_or(1) as usize);
            for (k, v) in ex["capacity"]["requests"].as_object().into_iter().flatten() {
                let q = gpupart::dra::slices::Quantity { value: v.as_str().unwrap_or_default().to_string() };
                req.capacity
                    .insert(k.clone(), q.as_u64().ok_or(format!("capacity request {k}: {v} is not a quantity"))?);
            }
            let exprs = class_obj["spec"]["selectors"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .chain(ex["selectors"].as_array().cloned().unwrap_or_default());
            for s in exprs {
                parse_cel(s["cel"]["expression"].as_str().unwrap_or_default(), &mut req)?;
            }
            requests.push(req);
        }
        // As kube-scheduler, a claim that cannot be allocated is tried again when a slice changes
        // (a republication under way); it is refused once the slices stay as they are.
        let got = loop {
            let slices = self.slices();
            let mut alloc = Allocator { slices: slices.clone(), ..Allocator::default() };
            for c in self.api.store().all("resourceclaims") {
                for r in c["status"]["allocation"]["devices"]["results"].as_array().cloned().unwrap_or_default() {
                    let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
                    let key = (s("driver"), s("pool"), s("device"));
                    if r["shareID"].is_string() {
                        let consumed = r["consumedCapacity"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .filter_map(|(k, v)| {
                                let q = gpupart::dra::slices::Quantity { value: v.as_str()?.to_string() };
                                Some((k.clone(), q.as_u64()?))
                            })
                            .collect();
                        alloc.shares.entry(key).or_default().push(consumed);
                    } else {
                        alloc.allocated.insert(key);
                    }
                }
            }
            if let Some(got) = alloc.allocate(&requests) {
                break got;
            }
            let quiet_until = Instant::now() + Duration::from_millis(300);
            while self.slices() == slices {
                if Instant::now() >= quiet_until {
                    return Err(format!("cannot allocate all claims ({name})"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        self.set_results(name, &got);
        Ok(got)
    }

    /// Writes claim `name`'s `status.allocation` with these results, shares included.
    pub fn set_results(&self, name: &str, got: &[Allocated]) {
        let results: Vec<Value> = got
            .iter()
            .map(|a| {
                let mut r = json!({"request": a.request, "driver": a.driver, "pool": a.pool, "device": a.device});
                if let Some(id) = &a.share_id {
                    r["shareID"] = json!(id);
                    let consumed: serde_json::Map<String, Value> =
                        a.consumed.iter().map(|(k, v)| (k.clone(), json!(v.to_string()))).collect();
                    r["consumedCapacity"] = Value::Object(consumed);
                }
                r
            })
            .collect();
        self.write_results(name, results);
    }

    /// Writes claim `name`'s `status.allocation` with these results: (request, driver, pool,
    /// device), as the scheduler does (tests also use it to allocate what no scheduler would).
    pub fn set_allocation(&self, name: &str, results: &[(&str, &str, &str, &str)]) {
        let results: Vec<Value> = results
            .iter()
            .map(|(request, driver, pool, device)| json!({"request": request, "driver": driver, "pool": pool, "device": device}))
            .collect();
        self.write_results(name, results);
    }

    fn write_results(&self, name: &str, results: Vec<Value>) {
        let key = ("resourceclaims".to_string(), "ml".to_string(), name.to_string());
        self.api.change(|s| {
            let mut c = s.objects.get(&key).cloned().expect("the claim exists");
            // As the scheduler, the claim's device configs go into the allocation (FromClaim).
            let config: Vec<Value> = c["spec"]["devices"]["config"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|mut x| {
                    x["source"] = json!("FromClaim");
                    x
                })
                .collect();
            c["status"] = json!({"allocation": {"devices": {"results": results, "config": config}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}});
            s.put(key.clone(), c);
        });
    }

    /// Deallocates a claim (the pod is gone) and deletes it.
    pub fn delete_claim(&self, name: &str) {
        self.api.delete("resourceclaims", "ml", name);
    }

    /// The kubelet prepares claim `name`: its devices' CDI ids, or the error (also when the
    /// plugin went away during the call).
    pub fn prepare(&self, name: &str) -> Result<Vec<(String, Vec<String>)>, String> {
        let uid = format!("uid-{name}");
        let mut answers = self.kubelet.try_prepare(&[("ml", name, &uid)])?;
        let a = answers.remove(&uid).ok_or("no answer for the claim")?;
        if !a.error.is_empty() {
            return Err(a.error);
        }
        Ok(a.devices.into_iter().map(|d| (d.device_name, d.cdi_device_ids)).collect())
    }

    /// The kubelet unprepares claim `name`: "" or the error.
    pub fn unprepare(&self, name: &str) -> String {
        let uid = format!("uid-{name}");
        self.kubelet.unprepare(&[("ml", name, &uid)]).remove(&uid).unwrap_or_default()
    }
}

/// Each simulated GPU's profile table, by index.
fn tables_of(state: &gpupart::mig::sim::SimState) -> std::collections::BTreeMap<u32, gpupart::mig::ProfileTable> {
    state
        .gpus
        .iter()
        .filter_map(|g| Some((g.index, gpupart::mig::catalog::lookup(&g.model)?.profile_table())))
        .collect()
}

/// Reads the CEL subset gpupart's classes and the tests use: `&&` of `device.driver == 'X'` and
/// `device.attributes['D'].NAME == 'V'`; anything else is an error naming it.
fn parse_cel(expr: &str, req: &mut Request) -> Result<(), String> {
    for term in expr.split("&&").map(str::trim).filter(|t| !t.is_empty()) {
        let (lhs, rhs) = term.split_once("==").ok_or(format!("the stand-in does not serve CEL {term:?}"))?;
        let value = rhs.trim().trim_matches(|c| c == '\'' || c == '"').to_string();
        let lhs = lhs.trim();
        if lhs == "device.driver" {
            req.driver = Some(value);
        } else if let Some(rest) = lhs.strip_prefix("device.attributes[") {
            let (_, attr) = rest.split_once("].").ok_or(format!("the stand-in does not serve CEL {term:?}"))?;
            req.selectors.push((attr.to_string(), value));
        } else {
            return Err(format!("the stand-in does not serve CEL {term:?}"));
        }
    }
    Ok(())
}
