;;;; char-transformer.lisp -- a small character-level transformer on Python's documentation.
;;;;
;;;; Same data as charlm.lisp (see examples/data/README.md): token and position embeddings,
;;;; DEPTH pre-norm transformer blocks with causal multi-head attention, a final layer norm
;;;; and a linear head.

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.003)
(defknob width 64)
(defknob heads 4)
(defknob depth 2)
(defknob context 32)
(defknob vocab 96 :doc "printable ASCII and newline, as make_corpus.py guarantees")

(defmodel char-transformer (vocab d heads depth context)
  (defpart embed (nn:embedding vocab d))
  (defpart pos (nn:embedding context d))
  (defpart blocks (repeat depth (nn:transformer-block d heads)))
  (defpart norm (nn:layer-norm d))
  (defpart head (nn:linear d vocab :bias nil))
  (forward (tokens)
    (let ((x (+ (embed tokens) (pos (arange context))))) (head (norm (blocks x))))))

(defloader train
  :source (text "data/stdlib-docstrings.txt")
  :prepare ((char-vocab) (windows :length (+ context 1)) (split :train 0.9 :seed 0))
  :fields ((tokens :i32 (context)) (targets :i32 (context)))
  :batch 16
  :shuffle t)

(defpart model (char-transformer vocab width heads depth context))

(defobjective (batch)
  (let ((logits (model (field batch tokens))))
    (metric acc (nn:accuracy logits (field batch targets)))
    (nn:cross-entropy logits (field batch targets))))

(defgroups (all "**" (optim:adamw :lr lr :weight-decay 0.0)))

(defrun :steps 300 :seed 0 :log-every 25)
