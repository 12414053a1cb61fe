# dyt.py: DyT (Zhu et al. 2025, "Transformers without Normalization") at initialisation,
# gamma 1, beta 0, alpha 0.5: tanh(0.5 x), as a norm kind (--norm dyt) and an activation
import numpy as np
import sigprop.extend

sigprop.extend.elementwise("dyt", lambda x: np.tanh(0.5 * x), lambda x: 0.5 * (1.0 - np.tanh(0.5 * x) ** 2),
                           title="DyT", kinks=())
