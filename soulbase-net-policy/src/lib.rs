//! Policy documents of soulbase-net.
