//! The daemon's answers: what was set is what the get_* commands return, limits read back the
//! way drivers print them (whole G from 1 GiB on, rounded down).

use std::collections::BTreeMap;

/// Prefix of a refusal on the socket; the client prints the rest to stderr and fails.
pub const REFUSED: &str = "ERR ";
/// Ends every reply on the socket, so a client tells a complete (maybe empty) answer from a
/// daemon that died before answering.
pub const END: &str = "\u{4}";

/// What a daemon holds.
pub struct State {
    /// The daemon's pid.
    pub pid: u32,
    /// `CUDA_VISIBLE_DEVICES` at daemon start.
    pub visible: String,
    /// Default active thread percentage.
    pub thread_percentage: f64,
    /// Default pinned device memory limits in MiB, by device (as given: ordinal or UUID).
    pub limits: BTreeMap<String, u64>,
    /// Client pids (from `fake-clients` in the pipe directory, read on every command).
    pub clients: Vec<u32>,
}

impl State {
    /// The pid reported for the MPS server while clients are connected (no such process).
    pub fn server_pid(&self) -> u32 {
        self.pid + 1
    }

    fn device_key(&self, dev: &str) -> Result<String, String> {
        let ok = dev == "0" || (!self.visible.is_empty() && (dev == self.visible || self.visible.starts_with(dev)));
        if ok {
            Ok(self.visible.clone())
        } else {
            Err(format!("invalid device '{dev}': the daemon sees device 0 ({})", self.visible))
        }
    }
}

/// Prints a limit the way the driver reads it back.
fn show_limit(mib: u64) -> String {
    if mib >= 1024 {
        format!("{}G", mib / 1024)
    } else {
        format!("{mib}M")
    }
}

fn parse_limit(v: &str) -> Option<u64> {
    let (n, f) = match v.strip_suffix('G') {
        Some(n) => (n, 1024),
        None => (v.strip_suffix('M')?, 1),
    };
    n.parse::<u64>().ok().map(|n| n * f)
}

/// Answers one command; `Err` is a refusal (the client fails with it).
pub fn answer(st: &mut State, line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["get_server_list"] => Ok(if st.clients.is_empty() { String::new() } else { format!("{}\n", st.server_pid()) }),
        ["get_client_list", pid] => {
            let pid: u32 = pid.parse().map_err(|_| format!("invalid server pid '{pid}'"))?;
            if st.clients.is_empty() || pid != st.server_pid() {
                return Err(format!("no MPS server with pid {pid}"));
            }
            Ok(st.clients.iter().map(|c| format!("{c}\n")).collect())
        }
        ["get_default_active_thread_percentage"] => Ok(format!("{:.1}\n", st.thread_percentage)),
        ["set_default_active_thread_percentage", pct] => {
            let v: f64 = pct.parse().map_err(|_| format!("invalid percentage '{pct}'"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(format!("invalid percentage '{pct}': expected 1 to 100"));
            }
            st.thread_percentage = v;
            Ok(format!("{v:.1}\n"))
        }
        ["get_default_device_pinned_mem_limit", dev] => {
            let key = st.device_key(dev)?;
            Ok(format!("{}\n", st.limits.get(&key).map_or_else(|| "0".to_string(), |m| show_limit(*m))))
        }
        ["set_default_device_pinned_mem_limit", dev, value] => {
            let key = st.device_key(dev)?;
            let mib = parse_limit(value).ok_or_else(|| format!("invalid limit '{value}': expected e.g. 512M or 7G"))?;
            st.limits.insert(key, mib);
            Ok(String::new())
        }
        _ => Err(format!(
            "fake-nvidia-cuda-mps-control: command '{line}' is not served by this test double (it serves get_server_list, get_client_list, get/set_default_active_thread_percentage, get/set_default_device_pinned_mem_limit, quit)\n"
        )),
    }
}
