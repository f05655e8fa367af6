//! `shop <policy.toml> <sku>`: prints the price of `sku` from the production pricing API.

use std::io::Write;

use shop::Shop;
use soulbase_net::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let policy = args
        .next()
        .unwrap_or_else(|| "examples/shop/policy.toml".to_owned());
    let sku = args.next().unwrap_or_else(|| "sku-1".to_owned());
    let doc = PolicyDocument::from_path(&policy)?;
    let shop = Shop::new(
        doc,
        "https://pricing.example.com",
        "https://orders.example.com",
    )?;
    let price = shop.price(&sku).await?;
    writeln!(std::io::stdout(), "{}: {} cents", price.sku, price.cents)?;
    Ok(())
}
