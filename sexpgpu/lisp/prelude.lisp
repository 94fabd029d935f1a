;;;; prelude.lisp -- loaded before every file.
;;;;
;;;; Everything here is written in SexpGPU Lisp over the evaluator's special forms and the
;;;; builtins. Names starting with % are internal: macros below expand into them, but user
;;;; files cannot see them.

;;; ------------------------------------------------------------------------------------------
;;; Definitions

(%defmacro defmacro (name lambda-list &body body)
  `(%defmacro ,name ,lambda-list ,@(%body-without-doc body)))

(%defun '%body-without-doc
  (lambda (body)
    (if (if (stringp (car body)) (cdr body) nil)
        (cdr body)
        body)))

(%defun '%split-body
  ;; (values declarations forms): the leading docstring is dropped, declarations kept apart
  (lambda (body)
    (let ((decls nil))
      (setq body (%body-without-doc body))
      (tagbody
       next
         (if (if (consp (car body)) (%name= (car (car body)) "DECLARE") nil)
             (progn (setq decls (cons (car body) decls))
                    (setq body (cdr body))
                    (go next))))
      (values (reverse decls) body))))

(defmacro defun (name lambda-list &body body)
  (multiple-value-call
      (lambda (decls forms)
        (if (consp name)
            `(%defsetf-function ',(car (cdr name))
                                (lambda ,lambda-list ,@decls (block ,(car (cdr name)) ,@forms)))
            `(%defun ',name (lambda ,lambda-list ,@decls (block ,name ,@forms)))))
    (%split-body body)))

(defmacro defvar (name &optional (value nil value-p) doc)
  (if value-p
      `(%defvar ',name (if (boundp ',name) (symbol-value ',name) ,value) nil)
      `(progn (%defvar ',name nil nil) ',name)))

(defmacro defparameter (name value &optional doc)
  `(%defvar ',name ,value t))

(defmacro defconstant (name value &optional doc)
  `(%defconstant ',name ,value))

;;; ------------------------------------------------------------------------------------------
;;; Control

(defmacro when (test &body body)
  `(if ,test (progn ,@body) nil))

(defmacro unless (test &body body)
  `(if ,test nil (progn ,@body)))

(defmacro and (&rest forms)
  (if (null forms)
      t
      (if (null (cdr forms))
          (car forms)
          `(if ,(car forms) (and ,@(cdr forms)) nil))))

(defmacro or (&rest forms)
  (if (null forms)
      nil
      (if (null (cdr forms))
          (car forms)
          (let ((g (gensym "OR")))
            `(let ((,g ,(car forms)))
               (if ,g ,g (or ,@(cdr forms))))))))

(defmacro cond (&rest clauses)
  (if (null clauses)
      nil
      (let ((clause (car clauses)))
        (if (null (cdr clause))
            (let ((g (gensym "COND")))
              `(let ((,g ,(car clause)))
                 (if ,g ,g (cond ,@(cdr clauses)))))
            `(if ,(car clause)
                 (progn ,@(cdr clause))
                 (cond ,@(cdr clauses)))))))

(defmacro return (&optional value)
  `(return-from nil ,value))

(defmacro prog1 (first &body body)
  (let ((g (gensym "PROG1")))
    `(let ((,g ,first)) ,@body ,g)))

(defmacro prog2 (first second &body body)
  `(progn ,first (prog1 ,second ,@body)))

(defmacro multiple-value-bind (vars form &body body)
  (let ((rest (gensym "REST")))
    `(multiple-value-call (lambda (&optional ,@vars &rest ,rest)
                            (declare (ignore ,rest))
                            ,@body)
       ,form)))

(defmacro multiple-value-list (form)
  `(multiple-value-call #'list ,form))

(defmacro multiple-value-setq (vars form)
  (let ((temps (%gensym-list (length vars))))
    `(multiple-value-bind ,temps ,form
       ,@(mapcar (lambda (v g) `(setq ,v ,g)) vars temps)
       ,(car temps))))

(defmacro nth-value (n form)
  `(nth ,n (multiple-value-list ,form)))

(defmacro psetq (&rest pairs)
  (let ((bindings nil) (sets nil))
    (tagbody
     next
       (if pairs
           (let ((g (gensym "PSETQ")))
             (setq bindings (cons (list g (car (cdr pairs))) bindings))
             (setq sets (cons `(setq ,(car pairs) ,g) sets))
             (setq pairs (cdr (cdr pairs)))
             (go next))))
    `(let ,(reverse bindings) ,@(reverse sets) nil)))

(defun %case-test (key keyform)
  (cond ((or (%name= key "OTHERWISE") (eq key t)) t)
        ((listp key) `(member ,keyform ',key))
        (t `(eql ,keyform ',key))))

(defmacro case (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         `(,(%case-test (car clause) g) nil ,@(cdr clause)))
                       clauses)))))

(defmacro ecase (keyform &rest clauses)
  (let ((g (gensym "KEY"))
        (keys (mapcan (lambda (c) (if (listp (car c)) (copy-list (car c)) (list (car c)))) clauses)))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         `(,(%case-test (car clause) g) nil ,@(cdr clause)))
                       clauses)
             (t (error "~s fell through ecase: expected one of ~{~s~^, ~}" ,g ',keys))))))

(defmacro typecase (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         (if (or (%name= (car clause) "OTHERWISE") (eq (car clause) t))
                             `(t nil ,@(cdr clause))
                             `((typep ,g ',(car clause)) nil ,@(cdr clause))))
                       clauses)))))

(defmacro etypecase (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (typecase ,g
         ,@clauses
         (otherwise (error "~s fell through etypecase: expected one of the types ~{~s~^, ~}"
                           ,g ',(mapcar #'car clauses)))))))

;;; ------------------------------------------------------------------------------------------
;;; Iteration

(defmacro dolist ((var list &optional result) &body body)
  (let ((tail (gensym "TAIL")) (top (gensym "TOP")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (let ((,tail ,list))
           (tagbody
            ,top
              (if (consp ,tail)
                  (let ((,var (car ,tail)))
                    ,@decls
                    (tagbody ,@forms)
                    (setq ,tail (cdr ,tail))
                    (go ,top))))
           (let ((,var nil))
             (declare (ignorable ,var))
             ,result))))))

(defmacro dotimes ((var count &optional result) &body body)
  (let ((n (gensym "N")) (top (gensym "TOP")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (let ((,n ,count) (,var 0))
           ,@decls
           (tagbody
            ,top
              (if (< ,var ,n)
                  (progn (tagbody ,@forms)
                         (setq ,var (1+ ,var))
                         (go ,top))))
           ,result)))))

(defun %do-expansion (let-form set-form specs end-clause body)
  (let ((top (gensym "TOP"))
        (steps (mapcan (lambda (spec)
                         (if (and (consp spec) (cdr (cdr spec)))
                             (list (car spec) (car (cdr (cdr spec))))
                             nil))
                       specs)))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (,let-form ,(mapcar (lambda (spec)
                               (if (consp spec) (list (car spec) (car (cdr spec))) spec))
                             specs)
           ,@decls
           (tagbody
            ,top
              (if ,(car end-clause) (return-from nil (progn ,@(cdr end-clause))))
              (tagbody ,@forms)
              (,set-form ,@steps)
              (go ,top)))))))

(defmacro do (specs end-clause &body body)
  (%do-expansion 'let 'psetq specs end-clause body))

(defmacro do* (specs end-clause &body body)
  (%do-expansion 'let* 'setq specs end-clause body))

;;; ------------------------------------------------------------------------------------------
;;; Macro-writing helpers

(defmacro with-gensyms (names &body body)
  `(let ,(mapcar (lambda (n)
                   (if (consp n)
                       `(,(car n) (gensym ,(car (cdr n))))
                       `(,n (gensym ,(symbol-name n)))))
                 names)
     ,@body))

(defmacro once-only (names &body body)
  ;; each NAME is evaluated once, in order, by the expansion the body produces
  (let ((temps (mapcar (lambda (n) (gensym (symbol-name n))) names)))
    `(let ,(mapcar (lambda (g) `(,g (gensym "ONCE"))) temps)
       (list 'let
             (list ,@(mapcar (lambda (g n) `(list ,g ,n)) temps names))
             (let ,(mapcar (lambda (n g) `(,n ,g)) names temps)
               ,@body)))))

;;; ------------------------------------------------------------------------------------------
;;; Places: setf and friends

(defun %place-function-call-p (place)
  (and (consp place) (symbolp (car place))))

(defun %simple-setf (place value)
  ;; the store form for PLACE whose subforms are already evaluated (or pure)
  (if (symbolp place)
      `(setq ,place ,value)
      (let ((op (car place)) (args (cdr place)))
        (cond ((%name= op "CAR") `(%rplaca-value ,(car args) ,value))
              ((%name= op "FIRST") `(%rplaca-value ,(car args) ,value))
              ((%name= op "CDR") `(%rplacd-value ,(car args) ,value))
              ((%name= op "REST") `(%rplacd-value ,(car args) ,value))
              ((%name= op "NTH") `(%set-nth ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "ELT") `(%set-elt ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "AREF") `(%aset ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "SVREF") `(%aset ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "GETHASH") `(%puthash ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "SYMBOL-VALUE") `(set ,(car args) ,value))
              ((%name= op "GETF")
               (let ((v (gensym "V")))
                 `(let ((,v ,value))
                    ,(%setf-1 (car args) `(%putf ,(car args) ,(car (cdr args)) ,v))
                    ,v)))
              ((%cxr-path op)
               (let ((path (%cxr-path op)))
                 (if (string= (subseq path 0 1) "A")
                     `(%rplaca-value ,(%cxr-form (subseq path 1) (car args)) ,value)
                     `(%rplacd-value ,(%cxr-form (subseq path 1) (car args)) ,value))))
              ((assoc (symbol-name op) '(("SECOND" . 1) ("THIRD" . 2) ("FOURTH" . 3) ("FIFTH" . 4)
                                         ("SIXTH" . 5) ("SEVENTH" . 6) ("EIGHTH" . 7) ("NINTH" . 8)
                                         ("TENTH" . 9))
                      :test #'string=)
               `(%set-nth ,(cdr (assoc (symbol-name op) '(("SECOND" . 1) ("THIRD" . 2) ("FOURTH" . 3)
                                                         ("FIFTH" . 4) ("SIXTH" . 5) ("SEVENTH" . 6)
                                                         ("EIGHTH" . 7) ("NINTH" . 8) ("TENTH" . 9))
                                       :test #'string=))
                          ,(car args) ,value))
              ((%macro-p op) (%setf-1 (macroexpand-1 place) value))
              (t `(funcall (%setf-function ',op) ,value ,@args))))))

(defun %cxr-path (op)
  ;; "AD" for CADR etc. (only for c[ad]{2,4}r), nil otherwise
  (let ((name (symbol-name op)))
    (if (and (> (length name) 3) (< (length name) 7)
             (string= (subseq name 0 1) "C")
             (string= (subseq name (1- (length name))) "R")
             (every (lambda (c) (or (char= c #\A) (char= c #\D)))
                    (subseq name 1 (1- (length name)))))
        (subseq name 1 (1- (length name)))
        nil)))

(defun %cxr-form (path form)
  (if (= (length path) 0)
      form
      (list (if (string= (subseq path 0 1) "A") 'car 'cdr)
            (%cxr-form (subseq path 1) form))))

(defun %setf-1 (place value)
  (%simple-setf place value))

(defmacro setf (&rest pairs)
  (if (oddp (length pairs))
      (error "setf needs an even number of arguments: (setf place value ...)"))
  (if (and pairs (null (cdr (cdr pairs))))
      (%setf-1 (car pairs) (car (cdr pairs)))
      (let ((forms nil))
        (tagbody
         next
           (if pairs
               (progn (setq forms (cons (%setf-1 (car pairs) (car (cdr pairs))) forms))
                      (setq pairs (cdr (cdr pairs)))
                      (go next))))
        `(progn ,@(reverse forms)))))

(defun %place-bindings (place)
  ;; (values bindings access-form): subforms of PLACE evaluated once, into temporaries
  (cond ((symbolp place) (values nil place))
        ((and (consp place) (%macro-p (car place))
              (not (member (symbol-name (car place)) '("GETF") :test #'string=)))
         (%place-bindings (macroexpand-1 place)))
        ((and (consp place) (%name= (car place) "GETF"))
         (multiple-value-bind (inner-bindings inner-access) (%place-bindings (car (cdr place)))
           (let ((k (gensym "KEY")))
             (values (append inner-bindings (list (list k (car (cdr (cdr place))))))
                     `(getf ,inner-access ,k)))))
        (t (let ((temps (mapcar (lambda (a) (declare (ignore a)) (gensym "ARG")) (cdr place))))
             (values (mapcar #'list temps (cdr place))
                     (cons (car place) temps))))))

(defmacro %modify-place (place fn-form)
  ;; (setf PLACE (FN-FORM current)) with PLACE's subforms evaluated once
  (multiple-value-bind (bindings access) (%place-bindings place)
    `(let* ,bindings
       ,(%setf-1 access (funcall fn-form access)))))

(defmacro incf (place &optional (delta 1))
  (multiple-value-bind (bindings access) (%place-bindings place)
    `(let* ,bindings ,(%setf-1 access `(+ ,access ,delta)))))

(defmacro decf (place &optional (delta 1))
  (multiple-value-bind (bindings access) (%place-bindings place)
    `(let* ,bindings ,(%setf-1 access `(- ,access ,delta)))))

(defmacro push (item place)
  (let ((g (gensym "ITEM")))
    (multiple-value-bind (bindings access) (%place-bindings place)
      `(let* ((,g ,item) ,@bindings) ,(%setf-1 access `(cons ,g ,access))))))

(defmacro pushnew (item place &rest keys)
  (let ((g (gensym "ITEM")))
    (multiple-value-bind (bindings access) (%place-bindings place)
      `(let* ((,g ,item) ,@bindings) ,(%setf-1 access `(adjoin ,g ,access ,@keys))))))

(defmacro pop (place)
  (let ((g (gensym "HEAD")))
    (multiple-value-bind (bindings access) (%place-bindings place)
      `(let* (,@bindings (,g ,access))
         (prog1 (car ,g) ,(%setf-1 access `(cdr ,g)))))))

(defmacro psetf (&rest pairs)
  (let ((bindings nil) (sets nil))
    (tagbody
     next
       (if pairs
           (let ((g (gensym "PSETF")))
             (setq bindings (cons (list g (car (cdr pairs))) bindings))
             (setq sets (cons (%setf-1 (car pairs) g) sets))
             (setq pairs (cdr (cdr pairs)))
             (go next))))
    `(let ,(reverse bindings) ,@(reverse sets) nil)))

(defmacro rotatef (&rest places)
  (if (null (cdr places))
      nil
      (let ((temps (mapcar (lambda (p) (declare (ignore p)) (gensym "ROT")) places)))
        `(let ,(mapcar #'list temps places)
           ,@(mapcar (lambda (p g) (%setf-1 p g))
                     places
                     (append (cdr temps) (list (car temps))))
           nil))))

(defmacro remf (place indicator)
  `(setf ,place (%remf ,place ,indicator)))

;;; ------------------------------------------------------------------------------------------
;;; Conditions

(defmacro ignore-errors (&body body)
  (let ((c (gensym "CONDITION")))
    `(handler-case (progn ,@body)
       (error (,c) (values nil ,c)))))

(defmacro assert (test &optional places datum &rest args)
  (declare (ignore places))
  (if datum
      `(unless ,test (error ,datum ,@args))
      `(unless ,test (error "The assertion ~s failed." ',test))))

(defmacro check-type (place type &optional type-string)
  (let ((v (gensym "VALUE")))
    `(let ((,v ,place))
       (unless (typep ,v ',type)
         (error 'type-error
                :format-control "The value of ~s is ~s, which is not ~a."
                :format-arguments (list ',place ,v ,(or type-string (format nil "of type ~s" type)))
                :datum ,v :expected-type ',type))
       nil)))

;;; ------------------------------------------------------------------------------------------
;;; Structures

(defun %defstruct-option (options name default)
  (let ((entry (find-if (lambda (o) (and (consp o) (%name= (car o) name))) options)))
    (cond ((null entry) (if (find-if (lambda (o) (%name= o name)) options) default default))
          ((cdr entry) (car (cdr entry)))
          (t default))))

(defmacro defstruct (name-and-options &rest slot-specs)
  (let* ((name (if (consp name-and-options) (car name-and-options) name-and-options))
         (options (if (consp name-and-options) (cdr name-and-options) nil))
         (prefix (let ((conc (%defstruct-option options "CONC-NAME" :default)))
                   (cond ((eq conc :default) (concatenate 'string (symbol-name name) "-"))
                         ((null conc) "")
                         (t (string conc)))))
         (include (%defstruct-option options "INCLUDE" nil))
         (inherited (if include (%struct-slots-with-defaults include) nil))
         (specs (append inherited
                        (mapcar (lambda (s) (if (consp s) (list (car s) (car (cdr s))) (list s nil)))
                                (if (stringp (car slot-specs)) (cdr slot-specs) slot-specs))))
         (slots (mapcar #'car specs))
         (constructor (%defstruct-option options "CONSTRUCTOR"
                                         (intern (concatenate 'string "MAKE-" (symbol-name name)))))
         (predicate (%defstruct-option options "PREDICATE"
                                       (intern (concatenate 'string (symbol-name name) "-P"))))
         (copier (%defstruct-option options "COPIER"
                                    (intern (concatenate 'string "COPY-" (symbol-name name)))))
         (obj (gensym "OBJ"))
         (value (gensym "VALUE"))
         (index -1))
    `(progn
       (%defstruct ',name ',slots ',include)
       (%remember-struct-defaults ',name ',specs)
       ,@(if constructor
             `((defun ,constructor (&key ,@specs)
                 (%make-struct ',name ,@slots))))
       ,@(if predicate `((defun ,predicate (,obj) (%struct-p ,obj ',name))))
       ,@(if copier `((defun ,copier (,obj) (copy-structure ,obj))))
       ,@(mapcan (lambda (slot)
                   (setq index (1+ index))
                   (let ((accessor (intern (concatenate 'string prefix (symbol-name slot)))))
                     `((defun ,accessor (,obj) (%struct-ref ,obj ',name ,index))
                       (defun (setf ,accessor) (,value ,obj) (%struct-set ,obj ',name ,index ,value)))))
                 slots)
       ',name)))

(defvar *%struct-defaults* (make-hash-table :test 'eq))

(defun %remember-struct-defaults (name specs)
  (setf (gethash name *%struct-defaults*) specs)
  name)

(defun %struct-slots-with-defaults (name)
  (multiple-value-bind (specs found) (gethash name *%struct-defaults*)
    (unless found (error "defstruct: :include names ~s, which is not a structure" name))
    specs))

;;; ------------------------------------------------------------------------------------------
;;; Functions on functions, trees, declarations

(defmacro declaim (&rest specs)
  (declare (ignore specs))
  nil)

(defun subst (new old tree &key (test #'eql))
  (cond ((funcall test old tree) new)
        ((consp tree)
         (let ((car (subst new old (car tree) :test test))
               (cdr (subst new old (cdr tree) :test test)))
           (if (and (eq car (car tree)) (eq cdr (cdr tree))) tree (cons car cdr))))
        (t tree)))

(defun complement (fn)
  (lambda (&rest args) (not (apply fn args))))

(defun constantly (value)
  (lambda (&rest args) (declare (ignore args)) value))

;;; ------------------------------------------------------------------------------------------
;;; loop: the common subset (for in/on/across/from/to/below/downto/by/=then,
;;; being the hash-keys/hash-values of [using], repeat,
;;; while/until, collect/append/nconc/sum/count/maximize/minimize [into], when/if/unless
;;; [and] [else] [end], do, with, initially, finally, return, named, always/never/thereis)

(defun %loop-kw-p (x &rest names)
  (and (symbolp x) x (member (symbol-name x) names :test #'string=)))

(defun %loop-destructure (pattern value)
  ;; setq forms binding the variables of a (possibly dotted) PATTERN from VALUE
  (cond ((null pattern) nil)
        ((symbolp pattern) (list `(setq ,pattern ,value)))
        (t (let ((g (gensym "D")))
             (list `(let ((,g ,value))
                      ,@(%loop-destructure (car pattern) `(car ,g))
                      ,@(%loop-destructure (cdr pattern) `(cdr ,g))))))))

(defun %loop-pattern-vars (pattern)
  (cond ((null pattern) nil)
        ((symbolp pattern) (list pattern))
        (t (append (%loop-pattern-vars (car pattern)) (%loop-pattern-vars (cdr pattern))))))

(defmacro loop (&rest clauses)
  (if (or (null clauses) (consp (car clauses)))
      (let ((top (gensym "TOP")))
        `(block nil (tagbody ,top ,@clauses (go ,top))))
      (%loop-expand clauses)))

(defun %loop-expand (clauses)
  (let ((name nil)
        (bindings nil)       ; let* bindings, in reverse
        (tests nil)          ; per-iteration head forms (termination tests, variable sets), reverse
        (steps nil)          ; end-of-iteration step forms, in reverse
        (body nil)           ; main clause forms, in reverse
        (initially nil)
        (finally nil)
        (result-var nil)
        (result-form nil)
        (tails nil)          ; (var . tailvar) for collect/append into
        (first (gensym "FIRST"))
        (end (gensym "END")))
    (labels ((peek () (car clauses))
             (next () (pop clauses))
             (kw-p (&rest names) (apply #'%loop-kw-p (peek) names))
             (expect-kw (&rest names)
               (unless (apply #'kw-p names)
                 (error "loop: expected ~{~a~^ or ~} but found ~s" (mapcar #'string-downcase names) (peek)))
               (next))
             (compound-forms ()
               (let ((forms nil))
                 (loop (if (and clauses (consp (peek))) (push (next) forms) (return)))
                 (reverse forms)))
             (bind (var value) (push (list var value) bindings))
             (accumulator (kind into)
               ;; the variable accumulated into; creates the default result variable
               (let ((var (or into result-var)))
                 (unless var
                   (setq var (gensym "RESULT"))
                   (setq result-var var)
                   (setq result-form var))
                 (unless (assoc var tails)
                   (let ((init (if (member kind '("SUM" "SUMMING" "COUNT" "COUNTING") :test #'string=) 0 nil)))
                     (bind var init)
                     (when (member kind '("COLLECT" "COLLECTING" "APPEND" "APPENDING" "NCONC" "NCONCING") :test #'string=)
                       (let ((tail (gensym "TAIL")))
                         (bind tail nil)
                         (push (cons var tail) tails)))
                     (unless (assoc var tails) (push (cons var nil) tails))))
                 var))
             (accumulate (kind form into)
               (let* ((var (accumulator kind into))
                      (tail (cdr (assoc var tails))))
                 (cond ((member kind '("COLLECT" "COLLECTING") :test #'string=)
                        (let ((cell (gensym "CELL")))
                          `(let ((,cell (list ,form)))
                             (if ,var (rplacd ,tail ,cell) (setq ,var ,cell))
                             (setq ,tail ,cell))))
                       ((member kind '("APPEND" "APPENDING" "NCONC" "NCONCING") :test #'string=)
                        (let ((new (gensym "NEW")))
                          `(let ((,new (copy-list ,form)))
                             (when ,new
                               (if ,var (rplacd ,tail ,new) (setq ,var ,new))
                               (setq ,tail (last ,new))))))
                       ((member kind '("SUM" "SUMMING") :test #'string=) `(setq ,var (+ ,var ,form)))
                       ((member kind '("COUNT" "COUNTING") :test #'string=) `(when ,form (setq ,var (1+ ,var))))
                       ((member kind '("MAXIMIZE" "MAXIMIZING") :test #'string=)
                        (let ((v (gensym "V"))) `(let ((,v ,form)) (setq ,var (if ,var (max ,var ,v) ,v)))))
                       (t
                        (let ((v (gensym "V"))) `(let ((,v ,form)) (setq ,var (if ,var (min ,var ,v) ,v))))))))
             (parse-for ()
               (let ((var (next)))
                 (cond
                   ((kw-p "IN")
                    (next)
                    (let ((tail (gensym "LIST")) (list-form (next)) (by nil))
                      (when (kw-p "BY") (next) (setq by (next)))
                      (bind tail list-form)
                      (dolist (v (%loop-pattern-vars var)) (bind v nil))
                      (push `(when (endp ,tail) (go ,end)) tests)
                      (dolist (f (%loop-destructure var `(car ,tail))) (push f tests))
                      (push (if by `(setq ,tail (funcall ,by ,tail)) `(setq ,tail (cdr ,tail))) steps)))
                   ((kw-p "ON")
                    (next)
                    (let ((tail (gensym "LIST")) (list-form (next)) (by nil))
                      (when (kw-p "BY") (next) (setq by (next)))
                      (bind tail list-form)
                      (dolist (v (%loop-pattern-vars var)) (bind v nil))
                      (push `(when (atom ,tail) (go ,end)) tests)
                      (dolist (f (%loop-destructure var tail)) (push f tests))
                      (push (if by `(setq ,tail (funcall ,by ,tail)) `(setq ,tail (cdr ,tail))) steps)))
                   ((kw-p "ACROSS")
                    (next)
                    (let ((vec (gensym "VECTOR")) (index (gensym "INDEX")))
                      (bind vec (next))
                      (bind index 0)
                      (dolist (v (%loop-pattern-vars var)) (bind v nil))
                      (push `(when (>= ,index (length ,vec)) (go ,end)) tests)
                      (dolist (f (%loop-destructure var `(aref ,vec ,index))) (push f tests))
                      (push `(setq ,index (1+ ,index)) steps)))
                   ((kw-p "=")
                    (next)
                    (let ((init (next)))
                      (dolist (v (%loop-pattern-vars var)) (bind v nil))
                      (if (kw-p "THEN")
                          (let ((then (progn (next) (next))))
                            (dolist (f (%loop-destructure var `(if ,first ,init ,then))) (push f tests)))
                          (dolist (f (%loop-destructure var init)) (push f tests)))))
                   ((kw-p "BEING")
                    (next)
                    (expect-kw "THE" "EACH")
                    (let* ((keys-p (kw-p "HASH-KEY" "HASH-KEYS"))
                           (kind (expect-kw "HASH-KEY" "HASH-KEYS" "HASH-VALUE" "HASH-VALUES"))
                           (tail (gensym "ENTRIES"))
                           (table (progn (expect-kw "OF" "IN") (next)))
                           (other nil))
                      (declare (ignore kind))
                      (when (kw-p "USING")
                        (next)
                        (setq other (car (cdr (next)))))
                      (bind tail `(%hash-entries ,table))
                      (dolist (v (%loop-pattern-vars var)) (bind v nil))
                      (when other (bind other nil))
                      (push `(when (endp ,tail) (go ,end)) tests)
                      (dolist (f (%loop-destructure var (if keys-p `(car (car ,tail)) `(cdr (car ,tail)))))
                        (push f tests))
                      (when other
                        (push `(setq ,other ,(if keys-p `(cdr (car ,tail)) `(car (car ,tail)))) tests))
                      (push `(setq ,tail (cdr ,tail)) steps)))
                   ((kw-p "FROM" "UPFROM" "DOWNFROM" "TO" "UPTO" "BELOW" "DOWNTO" "ABOVE" "BY")
                    (parse-arithmetic var))
                   (t (error "loop: unknown for clause after ~s: ~s" var (peek))))))
             (parse-arithmetic (var)
               (let ((start 0) (limit nil) (by 1) (down nil) (inclusive t) (has-limit nil))
                 (loop
                   (cond ((kw-p "FROM" "UPFROM") (next) (setq start (next)))
                         ((kw-p "DOWNFROM") (next) (setq start (next)) (setq down t))
                         ((kw-p "TO" "UPTO") (next) (setq limit (next)) (setq has-limit t))
                         ((kw-p "BELOW") (next) (setq limit (next)) (setq has-limit t) (setq inclusive nil))
                         ((kw-p "DOWNTO") (next) (setq limit (next)) (setq has-limit t) (setq down t))
                         ((kw-p "ABOVE") (next) (setq limit (next)) (setq has-limit t) (setq down t) (setq inclusive nil))
                         ((kw-p "BY") (next) (setq by (next)))
                         (t (return))))
                 (let ((limit-var (gensym "LIMIT")) (by-var (gensym "BY")))
                   (bind var start)
                   (when has-limit (bind limit-var limit))
                   (bind by-var by)
                   (when has-limit
                     (push `(when (,(if down (if inclusive '< '<=) (if inclusive '> '>=)) ,var ,limit-var)
                              (go ,end))
                           tests))
                   (push `(setq ,var (,(if down '- '+) ,var ,by-var)) steps))))
             (parse-conditional (negate)
               (let* ((test (next))
                      (then (parse-clause-group))
                      (else (when (kw-p "ELSE") (next) (parse-clause-group))))
                 (when (kw-p "END") (next))
                 `(if ,(if negate `(not ,test) test)
                      (progn ,@then)
                      (progn ,@else))))
             (parse-clause-group ()
               (let ((forms (list (parse-selectable))))
                 (loop (if (kw-p "AND") (progn (next) (push (parse-selectable) forms)) (return)))
                 (reverse forms)))
             (parse-selectable ()
               (cond
                 ((kw-p "COLLECT" "COLLECTING" "APPEND" "APPENDING" "NCONC" "NCONCING" "SUM" "SUMMING"
                        "COUNT" "COUNTING" "MAXIMIZE" "MAXIMIZING" "MINIMIZE" "MINIMIZING")
                  (let* ((kind (symbol-name (next))) (form (next)) (into nil))
                    (when (kw-p "INTO") (next) (setq into (next)))
                    (accumulate kind form into)))
                 ((kw-p "DO" "DOING") (next) `(progn ,@(compound-forms)))
                 ((kw-p "RETURN") (next) `(return-from ,name ,(next)))
                 ((kw-p "WHEN" "IF") (next) (parse-conditional nil))
                 ((kw-p "UNLESS") (next) (parse-conditional t))
                 (t (error "loop: expected a clause such as collect, do, when or return, found ~s" (peek))))))
      (when (kw-p "NAMED") (next) (setq name (next)))
      (loop
        (when (null clauses) (return))
        (cond
          ((kw-p "FOR" "AS") (next) (parse-for))
          ((kw-p "WITH")
           (next)
           (loop
             (let ((var (next)))
               (if (kw-p "=") (progn (next) (bind var (next))) (bind var nil)))
             (if (kw-p "AND") (next) (return))))
          ((kw-p "REPEAT")
           (next)
           (let ((counter (gensym "REPEAT")))
             (bind counter (next))
             (push `(if (<= ,counter 0) (go ,end) (setq ,counter (1- ,counter))) tests)))
          ((kw-p "WHILE") (next) (push `(unless ,(next) (go ,end)) body))
          ((kw-p "UNTIL") (next) (push `(when ,(next) (go ,end)) body))
          ((kw-p "ALWAYS")
           (next)
           (push `(unless ,(next) (return-from ,name nil)) body)
           (setq result-form t))
          ((kw-p "NEVER")
           (next)
           (push `(when ,(next) (return-from ,name nil)) body)
           (setq result-form t))
          ((kw-p "THEREIS")
           (next)
           (let ((v (gensym "V")))
             (push `(let ((,v ,(next))) (when ,v (return-from ,name ,v))) body)))
          ((kw-p "INITIALLY") (next) (setq initially (append initially (compound-forms))))
          ((kw-p "FINALLY") (next) (setq finally (append finally (compound-forms))))
          (t (push (parse-selectable) body))))
      (let ((top (gensym "TOP")))
        `(block ,name
           (let* (,@(reverse bindings) (,first t))
             ,@initially
             (tagbody
              ,top
                ,@(reverse tests)
                ,@(reverse body)
                ,@(reverse steps)
                (setq ,first nil)
                (go ,top)
              ,end
                ,@finally)
             ,result-form))))))
