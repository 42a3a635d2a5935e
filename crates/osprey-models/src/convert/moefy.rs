//! MoEfication of one dense SwiGLU MLP into a LatentMoE: the MLP's neurons are clustered into
//! equal-sized experts (balanced k-means on their gate vectors), each expert's router row is
//! its cluster's centroid, and the latent projections are the principal directions the MLP
//! reads (`Gᵀ G + Uᵀ U`) and writes (`D Dᵀ`). At full latent width the projections are the
//! identity and the experts partition the MLP exactly: with every expert selected the layer
//! computes the dense MLP.
//!
//! A centroid router alone sends nearly every token to the same few experts: a layer's inputs
//! share a large common direction, and the centroid most aligned with it wins whatever the
//! token. Given the mean input `μ` on calibration text, the router gets the bias
//! `b_e = -r_e · (W_down μ)`, so it scores the token's departure from the typical input
//! (`r_e · (z - W_down μ)`) and the choice depends on the token.

use nalgebra::{DMatrix, SymmetricEigen};

/// A dense MLP's weights, row-major: `gate` and `up` are `[hidden, width]`, `down` is
/// `[width, hidden]`.
pub struct DenseMlp<'a> {
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
    pub width: usize,
    pub hidden: usize,
}

/// One routed expert in latent space: `gate`, `up` `[expert_dim, latent]`, `down`
/// `[latent, expert_dim]`.
pub struct Expert {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// The LatentMoE made from a dense MLP.
pub struct Moefied {
    /// `W_down`, `[latent, width]`.
    pub down: Vec<f32>,
    /// `W_up`, `[width, latent]`.
    pub up: Vec<f32>,
    /// `[experts, latent]`.
    pub router: Vec<f32>,
    /// `[experts]`: centres the scores on the calibration inputs (zeros without them).
    pub router_bias: Vec<f32>,
    pub experts: Vec<Expert>,
}

/// MoEfies `mlp` into `experts` experts working in a latent space of width `latent`;
/// `input_mean`, the MLP's mean input on calibration text, centres the router.
pub fn moefy(mlp: &DenseMlp, experts: usize, latent: usize, input_mean: Option<&[f32]>) -> Moefied {
    let (d, f) = (mlp.width, mlp.hidden);
    let clusters = balanced_kmeans(mlp.gate, d, experts, 12);
    let (p_in, p_out) = if latent == d {
        (identity(d), identity(d))
    } else {
        let g = DMatrix::from_row_slice(f, d, mlp.gate);
        let u = DMatrix::from_row_slice(f, d, mlp.up);
        let dn = DMatrix::from_row_slice(d, f, mlp.down);
        let reads = g.transpose() * &g + u.transpose() * &u;
        let writes = &dn * dn.transpose();
        (
            top_eigenvectors(reads, latent),
            top_eigenvectors(writes, latent),
        )
    };
    // A row `w` of width `d` seen from the latent space: `P w` (P is `[latent, d]`).
    let exact = latent == d;
    let project = |p: &[f32], w: &[f32]| -> Vec<f32> {
        if exact {
            return w.to_vec();
        }
        p.chunks_exact(d)
            .map(|row| row.iter().zip(w).map(|(a, b)| a * b).sum())
            .collect()
    };
    let experts_out = clusters
        .iter()
        .map(|members| {
            let rows = |m: &[f32]| -> Vec<f32> {
                members
                    .iter()
                    .flat_map(|&n| project(&p_in, &m[n * d..(n + 1) * d]))
                    .collect()
            };
            // Column n of `down` is neuron n's output direction; project it, lay out as
            // `[latent, expert_dim]`.
            let columns: Vec<Vec<f32>> = members
                .iter()
                .map(|&n| {
                    let col: Vec<f32> = (0..d).map(|i| mlp.down[i * f + n]).collect();
                    project(&p_out, &col)
                })
                .collect();
            let down = (0..latent)
                .flat_map(|i| columns.iter().map(move |c| c[i]))
                .collect();
            Expert {
                gate: rows(mlp.gate),
                up: rows(mlp.up),
                down,
            }
        })
        .collect();
    let router: Vec<f32> = clusters
        .iter()
        .flat_map(|members| {
            let mut c = vec![0f32; d];
            for &n in members {
                for (a, &w) in c.iter_mut().zip(&mlp.gate[n * d..(n + 1) * d]) {
                    *a += w / members.len() as f32;
                }
            }
            project(&p_in, &c)
        })
        .collect();
    let router_bias = match input_mean {
        Some(mu) => {
            let z_mu = project(&p_in, mu);
            (router.chunks_exact(latent))
                .map(|r| -r.iter().zip(&z_mu).map(|(a, b)| a * b).sum::<f32>())
                .collect()
        }
        None => vec![0.0; experts],
    };
    Moefied {
        down: p_in,
        up: transpose(&p_out, latent, d),
        router,
        router_bias,
        experts: experts_out,
    }
}

fn identity(d: usize) -> Vec<f32> {
    let mut m = vec![0f32; d * d];
    for i in 0..d {
        m[i * d + i] = 1.0;
    }
    m
}

fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| m[r * cols + c]))
        .collect()
}

/// The `k` eigenvectors of the symmetric matrix `a` with the largest eigenvalues, as the rows
/// of a `[k, n]` matrix.
fn top_eigenvectors(a: DMatrix<f32>, k: usize) -> Vec<f32> {
    let n = a.nrows();
    let eig = SymmetricEigen::new(a.map(f64::from));
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| eig.eigenvalues[j].total_cmp(&eig.eigenvalues[i]));
    order[..k]
        .iter()
        .flat_map(|&c| {
            eig.eigenvectors
                .column(c)
                .iter()
                .map(|&v| v as f32)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Clusters the `rows` (each `dim` wide) into `k` clusters of equal size by cosine
/// similarity: Lloyd iterations whose assignment step fills clusters greedily from the most
/// similar (row, centroid) pairs. Deterministic.
pub fn balanced_kmeans(rows: &[f32], dim: usize, k: usize, iterations: usize) -> Vec<Vec<usize>> {
    let n = rows.len() / dim;
    assert!(
        n.is_multiple_of(k),
        "{n} neurons do not split into {k} equal experts"
    );
    let cap = n / k;
    let unit: Vec<Vec<f32>> = rows.chunks_exact(dim).map(normalized).collect();
    // Spread initial centroids over the rows.
    let mut centroids: Vec<Vec<f32>> = (0..k).map(|c| unit[c * n / k].clone()).collect();
    let mut clusters = vec![Vec::new(); k];
    for _ in 0..iterations {
        let mut pairs: Vec<(f32, usize, usize)> = Vec::with_capacity(n * k);
        for (i, u) in unit.iter().enumerate() {
            for (c, centroid) in centroids.iter().enumerate() {
                pairs.push((dot(u, centroid), i, c));
            }
        }
        pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut assigned = vec![false; n];
        clusters = vec![Vec::with_capacity(cap); k];
        for (_, i, c) in pairs {
            if !assigned[i] && clusters[c].len() < cap {
                assigned[i] = true;
                clusters[c].push(i);
            }
        }
        for (centroid, members) in centroids.iter_mut().zip(&clusters) {
            let mut mean = vec![0f32; dim];
            for &i in members {
                for (m, v) in mean.iter_mut().zip(&unit[i]) {
                    *m += v;
                }
            }
            *centroid = normalized(&mean);
        }
    }
    for c in &mut clusters {
        c.sort_unstable();
    }
    clusters
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let norm = dot(v, v).sqrt().max(f32::MIN_POSITIVE);
    v.iter().map(|x| x / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_kmeans_partitions_into_equal_clusters_and_groups_alike_rows() {
        // Two directions, four rows each, interleaved.
        let rows: Vec<f32> = (0..8)
            .flat_map(|i| {
                if i % 2 == 0 {
                    [1.0, 0.1 * i as f32]
                } else {
                    [0.1 * i as f32, 1.0]
                }
            })
            .collect();
        let c = balanced_kmeans(&rows, 2, 2, 5);
        assert_eq!(c.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4]);
        let mut all: Vec<usize> = c.concat();
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert!(
            c.iter().all(|m| m.iter().all(|i| i % 2 == m[0] % 2)),
            "{c:?}"
        );
    }

    #[test]
    fn top_eigenvectors_of_a_diagonal_matrix_are_its_largest_axes() {
        let a = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(vec![1.0f32, 5.0, 3.0]));
        let p = top_eigenvectors(a, 2);
        assert!(
            (p[1].abs() - 1.0).abs() < 1e-6 && (p[5].abs() - 1.0).abs() < 1e-6,
            "{p:?}"
        );
    }
}
