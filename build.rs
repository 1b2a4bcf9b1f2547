//! Compiles the kubelet's gRPC API (proto/) with protox, a pure-Rust protobuf compiler, so a
//! fresh clone builds without protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/deviceplugin/v1beta1/api.proto", "proto/podresources/v1/api.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
