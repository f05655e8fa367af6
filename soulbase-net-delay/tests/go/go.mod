module soulbase.dev/delayinterop

go 1.19
