;;;; sweep.lisp -- the quickstart's MLP with a learning-rate sweep: the file the cluster
;;;; story in README.md runs (`sexpgpu sweep examples/sweep.lisp --sweep lr --ray ...`).

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1 :doc "SGD learning rate")

(defsweep lr :lr (0.025 0.05 0.1 0.2))

(defloader train
  :source (synthetic :spirals :n 2048 :classes 3 :seed 0)
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64)

(defpart net (nn:mlp 2 64 3))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps 300 :seed 0 :checkpoint (:every 100 :keep 2))
