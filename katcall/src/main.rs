fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let files = kat_api::bundle::read_dir(std::path::Path::new(&dir)).unwrap();
    match kat_api::WorkloadBundle::parse(files) {
        Ok(_) => println!("ok"),
        Err(e) => println!("{e}"),
    }
}
