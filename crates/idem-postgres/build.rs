//! Rebuilds the crate when a migration changes: `sqlx::migrate!()` embeds the
//! files of `migrations/` at compile time.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
