//! Compiles the tests' protobuf service in pure Rust (protox parses the
//! `.proto`; no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/payments.proto");
    let descriptors = protox::compile(["proto/payments.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
