//! A free loopback port for a process the tests start (the kube-apiserver, etcd, the kubelet,
//! reaplet's status endpoint). Loaded once per binary, beside `process` and `kube`, which
//! call it.

/// A free loopback port for a component to bind right after (checked by binding it once).
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), never the same twice in
/// this process: a port from `bind(:0)` is in that range, where any outgoing connection on
/// the machine may take it before the component binds it (CI saw the kubelet exit with
/// `bind: address already in use` on such a port). Never the kubelet's default ports
/// (10248 healthz, 10250 API, 10255 read-only): reaplet probes 127.0.0.1:10248 by default, and
/// a test's listener there would look like a live kubelet to an in-process agent.
pub fn free_port() -> u16 {
    const KUBELET_DEFAULTS: [u16; 3] = [10248, 10250, 10255];
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.saturating_sub(1));
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    // xorshift, seeded by the clock and the process: tests in parallel processes start apart
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32)
        | 1;
    for _ in 0..if high > low { 2000 } else { 0 } {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = low + (x % u64::from(high - low)) as u16;
        if !given.contains(&p)
            && !KUBELET_DEFAULTS.contains(&p)
            && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
        {
            given.insert(p);
            return p;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
