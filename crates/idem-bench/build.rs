//! Compiles the benchmark's gRPC service in pure Rust (protox parses the
//! `.proto`; no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/orders.proto");
    let descriptors = protox::compile(["proto/orders.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
