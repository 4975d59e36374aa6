"""FedJAX's FedAvg for bench/peer_worker.py (its own environment: fedjax, JAX, Haiku; no TF).

`fedjax.algorithms.fed_avg.federated_averaging` with `fedjax.optimizers.sgd`
on the client and the server, the setting's users as `fedjax.ClientDataset`s
batched in order (`ShuffleRepeatBatchHParams(skip_shuffle=True,
num_epochs=1)`), every user in every round. The models are the settings'
models written in Haiku with the same arithmetic as Keras' (VALID
convolutions, HWIO kernels, NHWC flattening; the GRU cell as Keras' with
`reset_after=True`: gates z, r, h in that order, the reset applied to the
recurrent product plus its bias), and start from the setting's Keras weights.
FedJAX weights clients by their example count; every client has K·B, so the
average is the same as the others'.
"""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

import fedjax
import peer_common


class KerasGRU(hk.Module):
  """Keras' GRU layer (reset_after=True, tanh, sigmoid), all outputs."""

  def __init__(self, units: int, name=None):
    super().__init__(name=name)
    self.units = units

  def __call__(self, x):
    u = self.units
    kernel = hk.get_parameter('kernel', (x.shape[-1], 3 * u), init=jnp.zeros)
    recurrent = hk.get_parameter('recurrent_kernel', (u, 3 * u), init=jnp.zeros)
    bias = hk.get_parameter('bias', (2, 3 * u), init=jnp.zeros)
    inputs = jnp.swapaxes(x @ kernel + bias[0], 0, 1)  # [time, batch, 3u]

    def step(h, xt):
      rt = h @ recurrent + bias[1]
      z = jax.nn.sigmoid(xt[:, :u] + rt[:, :u])
      r = jax.nn.sigmoid(xt[:, u:2 * u] + rt[:, u:2 * u])
      h = z * h + (1 - z) * jnp.tanh(xt[:, 2 * u:] + r * rt[:, 2 * u:])
      return h, h

    _, outputs = jax.lax.scan(step, jnp.zeros((x.shape[0], u), x.dtype), inputs)
    return jnp.swapaxes(outputs, 0, 1)


def _forward(model: str):
  classes = peer_common.SHAPES[model][3]

  def forward(batch, training=False):
    x = batch['x']
    if model == 'mlp':
      x = jax.nn.relu(hk.Linear(64)(x.reshape((x.shape[0], -1))))
    elif model == 'gru':
      x = hk.Embed(peer_common.GRU_VOCAB, 8)(x)
      x = KerasGRU(128)(x)
      x = KerasGRU(128)(x)
    else:
      x = jax.nn.relu(hk.Conv2D(32, 3, padding='VALID')(x))
      x = jax.nn.relu(hk.Conv2D(64, 3, padding='VALID')(x))
      x = hk.max_pool(x, (1, 2, 2, 1), (1, 2, 2, 1), 'VALID')
      if model == 'cifar_cnn' and training:
        x = hk.dropout(hk.next_rng_key(), 0.25, x)
      x = jax.nn.relu(hk.Linear(128)(x.reshape((x.shape[0], -1))))
      if model == 'cifar_cnn' and training:
        x = hk.dropout(hk.next_rng_key(), 0.5, x)
    return hk.Linear(classes)(x)
  return hk.transform(forward)


# Keras weights, in order → (Haiku module, parameter).
PARAMETERS = {
    'mlp': [('linear', 'w'), ('linear', 'b'), ('linear_1', 'w'), ('linear_1', 'b')],
    'cnn': [('conv2_d', 'w'), ('conv2_d', 'b'), ('conv2_d_1', 'w'), ('conv2_d_1', 'b'),
            ('linear', 'w'), ('linear', 'b'), ('linear_1', 'w'), ('linear_1', 'b')],
    'gru': [('embed', 'embeddings')] + [
        (m, p) for m in ('keras_gru', 'keras_gru_1') for p in ('kernel', 'recurrent_kernel', 'bias')
    ] + [('linear', 'w'), ('linear', 'b')],
}
PARAMETERS['cifar_cnn'] = PARAMETERS['cnn']


def _per_example_loss(batch, logits):
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, batch['y'][..., None], axis=-1)[..., 0]
  return nll.reshape((nll.shape[0], -1)).mean(axis=1)  # the GRU: mean over positions


class FedjaxFedAvg:
  """FedAvg in FedJAX on the setting's users and initial weights."""

  def __init__(self, data: peer_common.SettingData):
    s = data.setting
    self.data, self.order = data, PARAMETERS[s.model]
    sample = {'x': data.x[0, :s.batch], 'y': data.y[0, :s.batch]}
    self.model = fedjax.create_model_from_haiku(
        _forward(s.model), sample, _per_example_loss,
        train_kwargs={'training': True}, eval_kwargs={'training': False})
    self.algorithm = fedjax.algorithms.fed_avg.federated_averaging(
        fedjax.model_grad(self.model), fedjax.optimizers.sgd(s.client_lr),
        fedjax.optimizers.sgd(s.server_lr),
        fedjax.ShuffleRepeatBatchHParams(batch_size=s.batch, num_epochs=1, skip_shuffle=True))
    params = {m: dict(p) for m, p in self.model.init(jax.random.PRNGKey(0)).items()}
    for (module, name), w in zip(self.order, data.weights):
      assert params[module][name].shape == w.shape, (module, name, w.shape)
      params[module][name] = jnp.asarray(w)
    self.state = self.algorithm.init(params)
    self.clients = [(c, fedjax.ClientDataset({'x': data.x[c], 'y': data.y[c]}),
                     jax.random.PRNGKey(c)) for c in range(s.clients)]
    self.notes = f'fedjax.algorithms.fed_avg (JAX {jax.__version__}, Haiku {hk.__version__})'

  def __call__(self):
    self.state, _ = self.algorithm.apply(self.state, self.clients)
    jax.block_until_ready(self.state.params)

  def weights(self):
    return [np.asarray(self.state.params[m][p]) for m, p in self.order]

  def loss(self, weights) -> float:
    """Mean loss of `weights` on every client's examples (the worker's loss_of, in JAX)."""
    params = {m: dict(p) for m, p in self.state.params.items()}
    for (module, name), w in zip(self.order, weights):
      params[module][name] = jnp.asarray(w)
    x = self.data.x.reshape((-1,) + self.data.x.shape[2:])
    y = self.data.y.reshape((-1,) + self.data.y.shape[2:])
    total = 0.0
    for i in range(0, len(x), 500):
      batch = {'x': x[i:i + 500], 'y': y[i:i + 500]}
      total += float(_per_example_loss(batch, self.model.apply_for_eval(params, batch)).sum())
    return total / len(x)
