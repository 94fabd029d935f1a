;;;; quickstart.lisp -- the smallest file that trains: an MLP on three interleaved spirals.

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1)

(defloader train
  :source (synthetic :spirals :n 2048 :classes 3 :seed 0)
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64)

(defpart net (nn:mlp 2 64 3))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps 300 :seed 0)
