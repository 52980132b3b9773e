//! The Hugging Face Hub double ([`test_support::hub::HubDouble`]) as a program, for suites
//! that run outside cargo (`cargo xtask v11`): `hub-double <root>` serves `<root>/<org>/<repo>/…`
//! on 127.0.0.1 and prints its URL as the first line of stdout, then serves until killed.

use std::io::Write;

#[tokio::main]
async fn main() {
    let root = std::env::args().nth(1).expect("usage: hub-double <root>");
    let hub = test_support::hub::HubDouble::start(std::path::Path::new(&root), Default::default()).await;
    println!("{}", hub.url);
    std::io::stdout().flush().expect("stdout");
    std::future::pending::<()>().await;
}
