//! Medians, percentiles and the sample of one load run; the machine's load, its idle
//! CPUs and Redis's CPU, as the report reads them.

pub(crate) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub(crate) fn percentile(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted_ns.len() as f64).ceil() as usize;
    sorted_ns[rank.clamp(1, sorted_ns.len()) - 1] as f64 / 1000.0
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) rps: f64,
    /// Every request answered, warm-up and tail included (what the CPU was spent on).
    pub(crate) total: usize,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) n: usize,
    pub(crate) errors: usize,
}

pub(crate) fn fmt_f(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "–".into()
    }
}

pub(crate) fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// How this machine's idle CPUs wait (Linux's cpuidle driver, and the guest halt
/// polling window when the driver is `haltpoll`), empty when unreadable. Every figure
/// of a process woken after a wait moves with it: a CPU that halts at once costs the
/// woken process a trip through the hypervisor that one still polling does not.
pub(crate) fn cpu_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    if driver == "haltpoll" {
        let ns = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
        if !ns.is_empty() {
            return format!("{driver} (guest halt polling up to {ns} ns)");
        }
    }
    driver
}

/// Redis's CPU seconds so far from an `INFO cpu` reply: its user and system time, to
/// the microsecond.
pub(crate) fn info_cpu_seconds(info: &str) -> Result<f64, String> {
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or(format!("redis INFO cpu has no {k}"))
    };
    Ok(field("used_cpu_sys")? + field("used_cpu_user")?)
}
