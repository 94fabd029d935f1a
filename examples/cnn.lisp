;;;; cnn.lisp -- a small convolutional network on handwritten digits.
;;;;
;;;; Data: scikit-learn's bundled 8x8 digits, converted by examples/make_digits.py into
;;;; examples/data/digits.npz (see examples/data/README.md for provenance).

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.03)
(defknob channels 16)

(defmodel conv-layer (c-in c-out &key (kernel 3))
  "A 2-D convolution with bias, 'same' padding and a ReLU."
  (defparam w (c-out c-in kernel kernel) :init (kaiming))
  (defparam b (c-out) :init :zeros)
  (forward (x)
    (relu (+ (conv2d x w :padding (floor kernel 2)) (reshape b (list 1 c-out 1 1))))))

(defmodel digit-cnn (channels)
  (defpart conv1 (conv-layer 1 channels))
  (defpart conv2 (conv-layer channels (* 2 channels)))
  (defpart head (nn:linear (* 2 channels 2 2) 10))
  (forward (images)
    (let* ((h (max-pool2d (conv1 images) 2)) (h (max-pool2d (conv2 h) 2)))
      (head (reshape h (list (first (shape h)) -1))))))

(defloader train
  :source (npz "data/digits.npz")
  :prepare ((split :train 0.8 :seed 0))
  :fields ((image :f32 (1 8 8)) (label :i32 ()))
  :batch 64
  :shuffle t)

(defloader val
  :source (npz "data/digits.npz")
  :prepare ((split :train 0.8 :seed 0))
  :fields ((image :f32 (1 8 8)) (label :i32 ()))
  :batch 128)

(defpart net (digit-cnn channels))

(defobjective (batch)
  (let ((logits (net (field batch image))))
    (metric acc (nn:accuracy logits (field batch label)))
    (nn:cross-entropy logits (field batch label))))

(defevaluate (batch)
  (let ((logits (net (field batch image))))
    (metric loss (nn:cross-entropy logits (field batch label)))
    (metric acc (nn:accuracy logits (field batch label)))))

(defeval val :loader val :every 100)

(defgroups (all "**" (optim:momentum :lr lr :beta 0.9)))

(defrun :steps 400 :seed 0 :log-every 50)
