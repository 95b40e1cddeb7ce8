#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| matrix_proxy::fuzzing::http1_request(data));
