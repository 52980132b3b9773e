//! lemonade as a node among many: the model-server metrics contract routers and inference
//! gateways read, backpressure from remote upstreams, trace and session headers, spillover,
//! and three nodes behind a real router.

use std::path::Path;

use test_support::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_lemonade"))
}

#[tokio::test]
async fn real_llama_server_the_metrics_contract_shows_the_load_applied_under_lemonade_and_vllm_names() {
    let l = Lemonade::start(bin(), &["--metrics-names", "vllm"]).await;
    let base = l.url("");
    let out = py_checks("metrics_contract.py", &[&base, SMOL, "2", "3"]).await;
    println!("{out}");
}
