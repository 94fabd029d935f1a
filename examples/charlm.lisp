;;;; charlm.lisp -- a character-level language model on Python's own documentation.
;;;;
;;;; The text is the docstrings of 42 standard-library modules (examples/make_corpus.py
;;;; wrote examples/data/stdlib-docstrings.txt; see its header for provenance). Each position
;;;; predicts the next character from an embedding of the current one through an MLP: a
;;;; neural bigram model, the first step of a character-level transformer.

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.003 :doc "AdamW learning rate")
(defknob width 64 :doc "embedding width")
(defknob context 32 :doc "characters per training window")
(defknob vocab 96 :doc "printable ASCII and newline, as make_corpus.py guarantees")

(defmodel char-mlp (vocab d)
  (defpart embed (nn:embedding vocab d))
  (defpart head (nn:mlp d (* 4 d) vocab))
  (forward (tokens)
    (head (embed tokens))))

(defloader train
  :source (text "data/stdlib-docstrings.txt")
  :prepare ((char-vocab) (windows :length (+ context 1)) (split :train 0.9 :seed 0))
  :fields ((tokens :i32 (context)) (targets :i32 (context)))
  :batch 32
  :shuffle t)

(defpart model (char-mlp vocab width))

(defobjective (batch)
  (let ((logits (model (field batch tokens))))
    (metric acc (nn:accuracy logits (field batch targets)))
    (nn:cross-entropy logits (field batch targets))))

(defgroups (all "**" (optim:adamw :lr lr :weight-decay 0.0)))

(defrun :steps 600 :seed 0 :log-every 50)
