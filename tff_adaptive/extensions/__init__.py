"""Client behaviours beyond the core recipe, one module each (`rounds.extension`).

  client_state.py       the clients keep a state across rounds (SCAFFOLD's c_i)
  private_weights.py    the clients keep some weights as their own (MTFL's patches),
                        and the averaged non-trainable weights
  first_gradient.py     `upload` receives the first step's gradient (MimeXlite)
  full_gradient.py      a pass at x_t before training; `upload` receives its mean
                        gradient (Mime Lite)
  more_gradients.py     the local step takes gradients at other points or on more
                        batches (Per-FedAvg, pFedMe)
  user_accuracy.py      the clients measure a personalised model on their own test
                        split before training (UA)
  equal_local_steps.py  the server step assumes every client ran K steps (FedGBO)

An algorithm lists the ones it needs in `Recipe(extensions=...)`; a new
behaviour is a new module here, the engine (`rounds/`) unchanged.
"""
