"""The logistic probe: L2-penalised logistic regression fitted by L-BFGS over rows in memory.

METRICS.md, "Probes", Logistic; scikit-learn's `LogisticRegression(solver="lbfgs", C=C, tol=tol)`
written out: the objective is the mean log-loss plus `||W||^2 / (2 C n)` on the weights, never the
intercept, minimised by scipy's L-BFGS-B from zero with scikit-learn's settings (gradient
tolerance `tol`, at most `max_iter` iterations, 50 line-search steps, ftol 64 eps). Two classes
are one binomial weight vector (the second class positive; the symmetric two-class multinomial
is the same model at twice the C), three or more one weight vector per class (multinomial,
symmetric parametrisation). float64 always; the objective and its gradient are formed by numpy,
or by torch on `device` (a GPU) with L-BFGS's small state on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.special import expit, log_softmax, logsumexp


@dataclass(frozen=True)
class LogisticFit:
    """weights (1 or classes, d), intercepts (1 or classes); iterations taken, converged."""

    weights: np.ndarray
    intercepts: np.ndarray
    iterations: int
    converged: bool

    def raw(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows, dtype=np.float64) @ self.weights.T + self.intercepts

    def predict(self, rows: np.ndarray) -> np.ndarray:
        raw = self.raw(rows)
        return (raw[:, 0] > 0).astype(np.int64) if raw.shape[1] == 1 else raw.argmax(axis=1)

    def log_proba(self, rows: np.ndarray) -> np.ndarray:
        """log p(class | row), (m, classes)."""
        raw = self.raw(rows)
        if raw.shape[1] == 1:
            return np.column_stack([-np.logaddexp(0.0, raw[:, 0]), -np.logaddexp(0.0, -raw[:, 0])])
        return log_softmax(raw, axis=1)


def _host_objective(x: np.ndarray, codes: np.ndarray, classes: int, penalty: float):
    n, d = x.shape
    outputs = 1 if classes == 2 else classes
    positive = (codes == 1).astype(np.float64)
    onehot = np.zeros((n, outputs))
    if outputs > 1:
        onehot[np.arange(n), codes] = 1.0

    def value_and_gradient(parameters: np.ndarray):
        weights, intercepts = parameters[:outputs * d].reshape(outputs, d), parameters[outputs * d:]
        raw = x @ weights.T + intercepts
        if outputs == 1:
            loss = np.logaddexp(0.0, raw[:, 0]) - positive * raw[:, 0]
            pointwise = (expit(raw[:, 0]) - positive)[:, None] / n
        else:
            norms = logsumexp(raw, axis=1)
            loss = norms - raw[np.arange(n), codes]
            pointwise = (np.exp(raw - norms[:, None]) - onehot) / n
        value = loss.sum() / n + 0.5 * penalty * float(np.einsum("ij,ij->", weights, weights))
        gradient = np.concatenate([(pointwise.T @ x + penalty * weights).ravel(), pointwise.sum(axis=0)])
        return value, gradient

    return value_and_gradient


def _device_objective(x: np.ndarray, codes: np.ndarray, classes: int, penalty: float, device: str):
    import torch

    n, d = x.shape
    outputs = 1 if classes == 2 else classes
    rows = torch.as_tensor(x, dtype=torch.float64, device=device)
    labels = torch.as_tensor(codes, dtype=torch.int64, device=device)
    positive = (labels == 1).to(torch.float64)

    def value_and_gradient(parameters: np.ndarray):
        theta = torch.as_tensor(parameters, dtype=torch.float64, device=device)
        weights, intercepts = theta[:outputs * d].reshape(outputs, d), theta[outputs * d:]
        raw = rows @ weights.T + intercepts
        if outputs == 1:
            loss = torch.nn.functional.softplus(raw[:, 0]) - positive * raw[:, 0]
            pointwise = (torch.sigmoid(raw[:, 0]) - positive)[:, None] / n
        else:
            norms = torch.logsumexp(raw, dim=1)
            loss = norms - raw.gather(1, labels[:, None])[:, 0]
            pointwise = torch.softmax(raw, dim=1) / n
            pointwise[torch.arange(n, device=device), labels] -= 1.0 / n
        value = loss.sum() / n + 0.5 * penalty * (weights * weights).sum()
        gradient = torch.cat([(pointwise.T @ rows + penalty * weights).reshape(-1), pointwise.sum(dim=0)])
        return float(value), gradient.cpu().numpy()

    return value_and_gradient


def fit_logistic(x: np.ndarray, codes: np.ndarray, classes: int, C: float = 1.0, tol: float = 1e-4,
                 max_iter: int = 1000, device: str | None = None) -> LogisticFit:
    """Fit on rows `x` (n, d) with labels `codes` in 0..classes-1 (module docstring)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    n, d = x.shape
    outputs = 1 if classes == 2 else classes
    penalty = 1.0 / (C * n)
    objective = (_host_objective(x, codes, classes, penalty) if device is None
                 else _device_objective(x, codes, classes, penalty, device))
    found = optimize.minimize(objective, np.zeros(outputs * (d + 1)), method="L-BFGS-B", jac=True,
                              options={"maxiter": max_iter, "maxls": 50, "gtol": tol,
                                       "ftol": 64 * np.finfo(float).eps})
    parameters = found.x
    return LogisticFit(parameters[:outputs * d].reshape(outputs, d).copy(), parameters[outputs * d:].copy(),
                       int(found.nit), bool(found.success))
