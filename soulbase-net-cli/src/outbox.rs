//! `soulbase-net outbox --db STORE [--table NAME] list | requeue ID | purge`: an outbox's
//! dead letters, by hand (the outbox crate's [`admin`](soulbase_net_outbox::admin)).

/// Runs `outbox ARGS`.
///
/// # Errors
/// The usage, or what failed.
pub async fn run(args: &[String]) -> Result<String, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if matches!(args.first(), None | Some(&("help" | "-h" | "--help"))) {
        return Ok(format!("{}\n", soulbase_net_outbox::admin::USAGE));
    }
    let lines = soulbase_net_outbox::admin::run(&args).await?;
    Ok(lines.iter().map(|l| format!("{l}\n")).collect())
}
