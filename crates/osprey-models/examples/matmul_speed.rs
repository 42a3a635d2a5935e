use candle_core::quantized::GgmlDType;
use osprey_models::kernels::matmul::{QMatrix, WeightFormat};
fn main() {
    for (dt, rows, cols, bs) in [
        (
            WeightFormat::Ggml(GgmlDType::Q4_1),
            1536usize,
            576usize,
            20usize,
        ),
        (WeightFormat::Ggml(GgmlDType::Q8_0), 49152, 576, 34),
        (WeightFormat::Mxfp4, 1536, 576, 17),
        (WeightFormat::Mxfp4, 49152, 576, 17),
    ] {
        let bytes: Vec<u8> = (0..rows * cols / 32 * bs)
            .map(|i| (i * 7 % 251) as u8 & 0x3f)
            .collect();
        let m = QMatrix::from_bytes(dt, rows, cols, &bytes).unwrap();
        println!("{dt} {rows}x{cols}");
        for t in [1usize, 4, 64, 512] {
            let x: Vec<f32> = (0..t * cols)
                .map(|i| ((i % 13) as f32 - 6.0) * 0.1)
                .collect();
            let mut out = vec![0f32; t * rows];
            let iters = (2000 / t).max(3);
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                m.matmul(&x, &mut out);
            }
            let el = t0.elapsed().as_secs_f64() / iters as f64;
            println!(
                "t={t:4} {:.3} ms  {:.1} GMAC/s",
                el * 1e3,
                (t * rows * cols) as f64 / el / 1e9
            );
        }
    }
}
