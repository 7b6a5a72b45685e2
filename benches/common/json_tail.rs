//! A growing JSON-lines file (the API server's audit log) read incrementally: each call parses
//! only what was written since the last one (re-reading the whole log on every poll would take
//! a core of a 2-core machine). Shared by the benchmarks that read the audit log.

use serde_json::Value;
use std::path::Path;

/// How far the file has been read.
#[derive(Default)]
pub struct JsonLinesTail {
    offset: u64,
}

impl JsonLinesTail {
    /// Calls `each` with every complete line written since the last call that parses as JSON
    /// (the writer may be in the middle of the last line: it is read next time). A file that
    /// cannot be opened or read yet gives nothing.
    pub fn read_new(&mut self, path: &Path, mut each: impl FnMut(&Value)) {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(path) else {
            return;
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return;
        }
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        for line in buf[..end].split(|b| *b == b'\n') {
            if let Ok(v) = serde_json::from_slice::<Value>(line) {
                each(&v);
            }
        }
        self.offset += end as u64 + 1;
    }
}
